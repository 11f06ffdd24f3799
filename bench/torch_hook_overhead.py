"""The cost of gotrain's PyTorch hook (internal/torchhook) per collective on
gloo: run by bench/torch_gloo_hangs.sh as WORLD_SIZE ranks (env:// init),
with and without the hook on PYTHONPATH. Times ITERS all_reduce calls of a
one-element tensor (the hook's cost at its most visible) and ITERS DDP steps
of a small model (one gradient bucket each, through the hook's comm hook
when it is on). Prints, on rank 0, one line per measure:

    overhead all_reduce_us MEDIAN_OF_REPEATS
    overhead ddp_step_us MEDIAN_OF_REPEATS
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

iters, repeats = int(os.environ.get("ITERS", "2000")), int(os.environ.get("REPEATS", "5"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
t = torch.ones(1)
model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x, y = torch.randn(8, 16), torch.randn(8, 1)


def allreduce():
    for _ in range(iters):
        dist.all_reduce(t)


def ddp_step():
    for _ in range(iters):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


for name, f in (("all_reduce_us", allreduce), ("ddp_step_us", ddp_step)):
    f()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        f()
        times.append((time.perf_counter() - start) / iters * 1e6)
    if rank == 0:
        print(f"overhead {name} {statistics.median(times):.2f}", flush=True)
dist.destroy_process_group()
