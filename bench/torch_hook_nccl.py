"""gotrain's PyTorch hook stays out of NCCL jobs (their collectives come from
NCCL RAS): a DDP job on the NCCL backend, run under `gotrain launch --gpus
N`, trains and then prints whether this rank wrote a hook record (it must
not) and the step time.

    gotrain launch --gpus 1 -- python bench/torch_hook_nccl.py
"""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank = dist.get_rank()
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(dev)
model = DDP(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(dev), device_ids=[dev.index])
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x, y = torch.randn(256, 1024, device=dev), torch.randn(256, 1, device=dev)
for step in range(200):
    if step == 50:
        torch.cuda.synchronize()
        start = time.perf_counter()
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
torch.cuda.synchronize()
out = os.environ.get("GOTRAIN_TORCH_PROGRESS_DIR", "")
mine = os.path.exists(os.path.join(out, "%d.progress" % os.getpid())) if out else False
print(f"nccl rank {rank}: hook dir set {bool(out)}, record written {mine}, step {(time.perf_counter() - start) / 150 * 1e3:.3f} ms", flush=True)
dist.destroy_process_group()
