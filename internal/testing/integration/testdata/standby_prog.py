# An unchanged torch.distributed (gloo) program for Python standbys
# (pystandby_test.go): it prints what it sees, all-reduces, and on its
# first run rank CRASH exits 3 once GO exists ("-": at once). The
# restarted ranks run FINAL: "loaders" (DataLoaders with 2 fork and 2
# spawn workers), "exit7" (rank 0 exits 7), "raise" (rank 0 raises).
#
#   python3 standby_prog.py GO CRASH FINAL    or    python3 -m standby_prog ...
import os
import signal
import sys
import time

WARM = "torch" in sys.modules  # imported before this line: a warm standby

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


def loader_sum(ctx):
    dl = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context=ctx)
    return sum(float(b.sum()) for b in dl)


def main():
    go, crash, final = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    keys = ",".join(sorted(k for k in os.environ))
    sigs = ",".join(str(signal.getsignal(s)).replace(" ", "_") for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGUSR1))
    out = f"{sys.stdout.line_buffering},{sys.stdout.write_through},{sys.stderr.line_buffering}"
    print(f"run rank={rank} restart={restart} pid={os.getpid()} warm={WARM} name={__name__} "
          f"file={__file__} argv={sys.argv!r} path0={sys.path[0]} cwd={os.getcwd()} sigs={sigs} out={out} keys={keys}", flush=True)
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"allreduce rank={rank} restart={restart} sum={t.item():g}", flush=True)
    if restart == 0:
        if rank == crash:
            while go != "-" and not os.path.exists(go):
                time.sleep(0.05)
            os._exit(3)
        time.sleep(600)  # stopped when the crashing rank's generation ends
    if "loaders" in final:
        print(f"loaders rank={rank} fork={loader_sum('fork'):g} spawn={loader_sum('spawn'):g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and "raise" in final:
        raise ValueError("boom from the program")
    if rank == 0 and "exit7" in final:
        sys.exit(7)


if __name__ == "__main__":
    main()
