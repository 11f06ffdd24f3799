"""A plain torch.distributed DDP training loop on gloo, as users write it:
it reads only torchrun's variables. Every rank trains on its shard; at the
end rank 0 gathers every rank's parameter checksum and prints whether the
ranks agree, and each rank prints what torchrun's variables said."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = {k: os.environ.get(k, "") for k in (
        "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS")}
    print("env " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(256, 8, generator=g)
    y = x.sum(dim=1, keepdim=True)
    first = None
    for step in range(60):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    checksum = torch.tensor([sum(p.double().sum().item() for p in model.parameters())], dtype=torch.float64)
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(sums, checksum)
    agree = all(abs(s.item() - sums[0].item()) < 1e-9 for s in sums)
    if rank == 0:
        print(f"world_size={world} loss {first:.4f} -> {loss.item():.4f} ranks_agree={str(agree).lower()}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if agree and loss.item() < first else 1)


if __name__ == "__main__":
    main()
