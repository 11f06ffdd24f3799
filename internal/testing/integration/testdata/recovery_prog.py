# A gloo DDP program for the recovery timing test (recovery_test.go): it
# imports an installed package besides torch (yaml), trains until it is
# killed on its first run, and on a restart reports a restore to the torch
# hook as the snapshot module does, takes STEPS steps and exits 0.
import importlib
import os
import sys
import time

YAML_WARM = "yaml" in sys.modules  # imported before this line: a standby preloaded it

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

importlib.import_module("yaml")  # what a standby preloads: its import is the point

rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"run rank={rank} restart={restart} pid={os.getpid()} yaml_warm={YAML_WARM}", flush=True)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if restart > 0:
    t0 = time.monotonic()
    time.sleep(0.05)  # the restore
    sys.modules["_gotrain_hook"].phase("restore", time.monotonic() - t0, bytes=1 << 20, source="agent", step=3)
step = 0
while restart == 0 or step < 5:
    opt.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    step += 1
    if step == 1:
        print(f"stepped rank={rank} restart={restart}", flush=True)
    if restart == 0:
        time.sleep(0.05)
dist.destroy_process_group()
