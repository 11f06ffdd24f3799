"""A torchrun-style elastic script: it checkpoints every step and, when
started again (TORCHELASTIC_RESTART_COUNT > 0), resumes from its checkpoint.
Usage: elastic_ckpt.py CHECKPOINT STEPS KILL_AT. In the first run (restart
count 0) rank 1 SIGKILLs itself after step KILL_AT's checkpoint."""
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    ckpt, steps, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        print(f"resumed from step {state['step']} at restart {restart}", flush=True)
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32 + rank
    y = x.sum(dim=1, keepdim=True)
    for step in range(start, steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():  # average gradients by hand, as DDP does
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        dist.barrier()
        if restart == 0 and rank == 1 and step == kill_at:
            print(f"rank 1 kills itself after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    w = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    all_w = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(all_w, w)
    agree = all(torch.equal(a, all_w[0]) for a in all_w)
    if rank == 0:
        print(f"done steps={steps} restart={restart} ranks_agree={str(agree).lower()}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
