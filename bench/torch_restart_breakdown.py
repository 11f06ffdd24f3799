# Where a restarted PyTorch rank's time goes, crash -> first all-reduce:
# the time (after the crash) at which the program's first line runs, torch
# is imported, the c10d store is made (rendezvous), the process group is
# made, and the first all-reduce completes. For bench/torch_restart_breakdown.sh.
#
#   python3 torch_restart_breakdown.py MARK
import sys
import time

T = {"start": time.time()}
WARM = "torch" in sys.modules
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

T["imported"] = time.time()
mark = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

_rendezvous = c10d.rendezvous


def timed_rendezvous(*a, **k):
    it = _rendezvous(*a, **k)
    v = next(it)
    T["store"] = time.time()
    yield v


c10d.rendezvous = timed_rendezvous
dist.init_process_group("gloo")
T["group"] = time.time()
x = torch.ones(1 << 20)
dist.all_reduce(x)
T["allreduce"] = time.time()
rank, world = dist.get_rank(), dist.get_world_size()
if attempt == 0:
    if rank == world - 1:
        time.sleep(float(os.environ.get("CRASH_AFTER", "4")))
        with open(mark + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.rename(mark + ".tmp", mark)
        os._exit(1)
    dist.all_reduce(x)
    time.sleep(600)
else:
    c = float(open(mark).read())
    parts = " ".join(f"{k}={v - c:.3f}" for k, v in T.items())
    print(f"BREAKDOWN rank={rank} torch={torch.__version__} warm={WARM} {parts}", flush=True)
dist.destroy_process_group()
