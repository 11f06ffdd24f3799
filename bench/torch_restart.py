# An unchanged torch.distributed program for bench/torch_restart.sh: crash ->
# first collective of the restarted group, under any launcher that restarts
# it (gotrain launch --max-restarts 1, torchrun --max-restarts 1).
#
# First attempt (TORCHELASTIC_RESTART_COUNT=0): every rank all-reduces once;
# then the last rank waits --crash-after seconds (the job "trains"), writes
# the time to --mark and exits 1; the others wait in a second all-reduce
# until the launcher stops them. Next attempt: each rank prints how long
# after the crash its first all-reduce completed, and whether torch was
# imported before the program's first line (warm: a gotrain Python standby).
#
#   python3 torch_restart.py --mark FILE [--crash-after S] [--backend nccl|gloo]
import sys
import time

WARM = "torch" in sys.modules

import argparse
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--mark", required=True)
p.add_argument("--crash-after", type=float, default=8.0)
# The default is found only when --backend is not given: the CUDA driver's
# first query costs ~0.25 s on a GPU machine (torch 2.11, H200), the
# program's own time under any launcher, which a gloo run should not count.
p.add_argument("--backend", default=None)
a = p.parse_args()
if a.backend is None:
    a.backend = "nccl" if torch.cuda.is_available() else "gloo"

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if a.backend == "nccl":
    lr = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(lr)
    dist.init_process_group("nccl", device_id=torch.device("cuda", lr))
    x = torch.ones(1 << 20, device="cuda")
else:
    dist.init_process_group("gloo")
    x = torch.ones(1 << 20)
dist.all_reduce(x)
if a.backend == "nccl":
    torch.cuda.synchronize()
rank, world = dist.get_rank(), dist.get_world_size()
if attempt == 0:
    if rank == world - 1:
        time.sleep(a.crash_after)
        with open(a.mark + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.rename(a.mark + ".tmp", a.mark)
        os._exit(1)
    dist.all_reduce(x)  # waits until the launcher tears the group down
    time.sleep(600)
else:
    t = time.time() - float(open(a.mark).read())
    print(f"RESTART rank={rank} attempt={attempt} recovered_in={t:.3f} warm={WARM}", flush=True)
dist.destroy_process_group()
