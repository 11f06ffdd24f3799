"""A gloo DDP training loop, unchanged PyTorch, for the hang tests: steps of
--step-time seconds each; rank --fault-rank at step --fault-step stops
calling collectives (it sleeps, FAULT stop) or spins in Python (FAULT spin),
while the others wait in that step's gradient all-reduce. Rank --slow-rank
takes --slow-step-time per step from step --slow-from on (SLOW). Each step is one
bucket, so the all-reduce of step S is collective #S+1 (#1 is step 0)."""
import argparse
import random
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--fault", default="stop", choices=["stop", "spin", "none"])
ap.add_argument("--fault-rank", type=int, default=1)
ap.add_argument("--fault-step", type=int, default=5)
ap.add_argument("--step-time", type=float, default=0.2)
ap.add_argument("--steps", type=int, default=1000000)
ap.add_argument("--jitter", type=float, default=0.0)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--slow-from", type=int, default=0)
ap.add_argument("--slow-step-time", type=float, default=0.0)
a = ap.parse_args()


def stop_calling_collectives(fault):
    """The fault, in a function of its own: its name is in the rank's
    Python stack."""
    end = time.time() + 3600
    while time.time() < end:
        if fault == "stop":
            time.sleep(1)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(a.steps):
    if a.fault != "none" and rank == a.fault_rank and step == a.fault_step:
        print(f"FAULT {a.fault} rank {rank} seq {step + 1} unix_ms {int(time.time() * 1000)}", flush=True)
        stop_calling_collectives(a.fault)
    pause = a.step_time
    if rank == a.slow_rank and step >= a.slow_from:
        if step == a.slow_from:
            print(f"SLOW rank {rank} seq {step + 1} unix_ms {int(time.time() * 1000)}", flush=True)
        pause = a.slow_step_time
    time.sleep(pause + random.uniform(-a.jitter, a.jitter))
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print(f"done rank {rank}", flush=True)
