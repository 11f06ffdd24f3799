# A two-rank gloo job for torchhook's tests: STEPS DDP steps of a small
# model, then an all_reduce, a barrier and a broadcast_object_list. With
# STOP_RANK set, that rank sleeps instead of the last step's collectives.
# Prints "RESULT rank pid checksum" (the parameters' exact bits). With
# NO_DESTROY set it exits right after its steps, as many programs do: with
# its DDP model alive and its process group not destroyed. With
# RESTORE_PHASE set it reports a restore to the hook, as the snapshot
# module does.
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="file://" + os.environ["INIT_FILE"], rank=rank, world_size=world)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)), bucket_cap_mb=0.002)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps, stop = int(os.environ["STEPS"]), int(os.environ.get("STOP_RANK", "-1"))
if os.environ.get("RESTORE_PHASE"):
    # As the snapshot module reports a restore (the hook's contract).
    time.sleep(0.05)
    sys.modules["_gotrain_hook"].phase("restore", 0.05, bytes=1234, source="agent", step=7)
print("READY", rank, os.getpid(), flush=True)
for step in range(steps):
    if rank == stop and step == steps - 1:
        print("STOPPED", rank, flush=True)
        time.sleep(600)
    g = torch.Generator().manual_seed(step * world + rank)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
if os.environ.get("NO_DESTROY"):
    print("RESULT", rank, os.getpid(), "-", flush=True)
    sys.exit(0)
t = torch.ones(8)
dist.all_reduce(t)
dist.barrier()
objs = [{"rank": rank}]
dist.broadcast_object_list(objs, src=0)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print("RESULT", rank, os.getpid(), h.hexdigest(), flush=True)
dist.destroy_process_group()
