# Two-line in-memory snapshots in a gloo training loop: restore_into() at
# start, snapshot() after every step. With --die, rank 1 SIGKILLs itself
# after step 20 on the first attempt; the restarted ranks resume from their
# agent's memory. The last line is the weights' sum, exactly (float.hex).
import os, signal, sys, torch, torch.distributed as dist
import gotrain
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
got = gotrain.restore_into({"model": model, "opt": opt})
if got is not None:
    _, step = got
    print("resumed at step", step, "from the agent's memory", flush=True)
g = torch.Generator().manual_seed(1)
xs = [torch.randn(4, 32, generator=g) for _ in range(40)]
for i in range(step, 40):
    loss = model(xs[i] + rank).pow(2).mean()
    opt.zero_grad(); loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad); p.grad /= dist.get_world_size()
    opt.step()
    gotrain.snapshot({"model": model, "opt": opt}, i + 1)
    if i + 1 == 20 and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and "--die" in sys.argv:
        print("dying at step 20", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
w = torch.cat([p.detach().flatten() for p in model.parameters()])
print("weights", w.double().sum().item().hex(), flush=True)
dist.destroy_process_group()
