# A rank run by a Python standby must be what a fresh `python3 SCRIPT` is
# (pystandby_test.go TestPythonStandbyRankIsAFreshRank): this program
# changes the environment before importing torch, as programs do, prints
# what it sees as one JSON line, all-reduces, and on its first run rank
# CRASH exits 3 once GO exists. MODE "cold" also sets a variable torch
# reads at import (the standby must then start the rank over, fresh).
#
#   python3 standby_fidelity.py GO CRASH MODE
import json
import os
import signal
import sys

os.environ["OMP_NUM_THREADS"] = "3"
if sys.argv[3] == "cold":
    os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
WARM = "torch" in sys.modules
GLOBALS = sorted(globals())
ANNOTATED = "__annotations__" in globals()

import torch
import torch.distributed as dist


def handlers():
    out = {}
    for s in signal.valid_signals():
        try:
            out[str(int(s))] = str(signal.getsignal(s))
        except (OSError, ValueError):
            pass
    return out


def main():
    go, crash = sys.argv[1], int(sys.argv[2])
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().rstrip(b"\0").split(b"\0")]  # what ps shows
    info = {
        "rank": rank, "restart": restart, "pid": os.getpid(), "warm": WARM,
        "env": dict(os.environ), "argv": sys.argv, "orig_argv": sys.orig_argv, "cmdline": cmdline,
        "fds": sorted(os.listdir("/proc/self/fd"), key=int), "cwd": os.getcwd(), "signals": handlers(),
        "threads": torch.get_num_threads(), "co_filename": main.__code__.co_filename,
        "file": __file__, "globals": GLOBALS, "annotations": ANNOTATED, "path0": sys.path[0],
        "executable": sys.executable, "flags": str(sys.flags),
        # The one difference meant: a standby's rank waits for rank 0's store.
        "store_wait": hasattr(sys.modules["torch.distributed.rendezvous"]._create_c10d_store, "__wrapped__"),
    }
    print("FIDELITY " + json.dumps(info, sort_keys=True), flush=True)
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"allreduce rank={rank} restart={restart} sum={t.item():g}", flush=True)
    if restart == 0:
        if rank == crash:
            while not os.path.exists(go):
                pass
            os._exit(3)
        signal.pause()  # stopped when the crashing rank's generation ends
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
