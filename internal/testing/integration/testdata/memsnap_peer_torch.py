# In-memory snapshots across a lost node, with real PyTorch
# (gloo): restore() at start, snapshot() after every step. The reduction
# does not depend on the world size: the batch is SHARDS fixed shards, each
# rank takes the gradients of shards s with s % world == rank, all_gather
# hands every rank all of them, and each sums them in shard order. So a job
# that goes from 3 ranks to 2 after a fault ends with the same bits as one
# of 3 ranks without it. With --hang, on the job's first attempt, rank 1
# waits at step K (its snapshot handed over, so replicated to the ring
# neighbour) for the test to kill its node. "state" and "weights" are the
# SHA-256 of the parameters' and momentum buffers' bytes.
import hashlib, os, sys, time, torch, torch.distributed as dist
import gotrain_snapshot as gs

SHARDS, STEPS, K = 6, 30, 12
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
first = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)


def digest():
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().contiguous().numpy().tobytes())
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            h.update(buf.contiguous().numpy().tobytes())
    return h.hexdigest()


step = 0
got = gs.restore()
if got is not None:
    state, step = got
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    print("resumed at step %d of world %d state %s" % (step, world, digest()), flush=True)
g = torch.Generator().manual_seed(1)
data = [[(torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)) for _ in range(SHARDS)] for _ in range(STEPS)]
sizes = [p.numel() for p in params]
for i in range(step, STEPS):
    local = torch.zeros(SHARDS, sum(sizes))
    for s in range(rank, SHARDS, world):
        x, y = data[i][s]
        loss = (model(x) - y).pow(2).mean()
        local[s] = torch.cat([gr.flatten() for gr in torch.autograd.grad(loss, params)])
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    total = parts[0][0].clone()
    for s in range(1, SHARDS):
        total = total + parts[s % world][s]
    total = total / SHARDS
    for p, gr in zip(params, total.split(sizes)):
        p.grad = gr.view_as(p).clone()
    opt.step()
    gs.snapshot({"model": model.state_dict(), "opt": opt.state_dict()}, i + 1)
    if i + 1 == K and first:
        print("saved step %d state %s" % (K, digest()), flush=True)
        if rank == 1 and "--hang" in sys.argv:
            print("waiting at step %d for the node to be killed: pid %d" % (K, os.getpid()), flush=True)
            while True:
                time.sleep(60)
print("weights %s" % digest(), flush=True)
dist.destroy_process_group()
