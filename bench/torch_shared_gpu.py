# Runs a PyTorch program, unchanged, where several ranks share one GPU
# (gotrain launch --ranks-per-gpu N, NCCL >= 2.30 with
# NCCL_MULTI_RANK_GPU_ENABLE=1). Two things stand in the way, and this
# wrapper does both before it runs the program (runpy, as `python3 prog`):
#
#  1. PyTorch calls its own NCCL (the wheel's, 2.28.9 with torch 2.11), which
#     refuses a second rank on one GPU. With --preload LIB the wrapper
#     restarts itself once with LD_PRELOAD=LIB, so that libtorch_cuda's NCCL
#     calls bind to LIB. torch.cuda.nccl.version() is the version PyTorch was
#     built against, not the one it calls: the wrapper prints the NCCL that
#     the process resolves (ncclGetVersion) and the libnccl files mapped;
#     NCCL_DEBUG=VERSION makes the library that init_process_group really
#     calls print its own version.
#  2. Programs call torch.cuda.set_device(LOCAL_RANK), but CUDA shows the
#     shared GPU once: a LOCAL_RANK past the visible devices is replaced by
#     LOCAL_RANK mod torch.cuda.device_count() (the rank's GPU). RANK and
#     WORLD_SIZE are left alone.
#
#   python3 bench/torch_shared_gpu.py [--preload /path/libnccl.so.2] prog.py [args...]
import ctypes
import os
import runpy
import sys

args = sys.argv[1:]
preload = None
if args[:1] == ["--preload"]:
    preload, args = args[1], args[2:]
if not args:
    sys.exit("usage: torch_shared_gpu.py [--preload LIB] prog.py [args...]")
if preload and preload not in os.environ.get("LD_PRELOAD", "").split(":"):
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in [preload, env.get("LD_PRELOAD", "")] if p)
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "--preload", preload] + args, env)

import torch  # noqa: E402  (after the re-exec, so the preload is in place)

tag = f"[torch_shared_gpu rank {os.environ.get('RANK', '?')}]"
local = int(os.environ.get("LOCAL_RANK", "0"))
n = torch.cuda.device_count()
if n == 0:
    sys.exit(f"{tag} no CUDA device visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
if local >= n:
    os.environ["LOCAL_RANK"] = str(local % n)
ver = ctypes.c_int(0)
try:
    ctypes.CDLL(None).ncclGetVersion(ctypes.byref(ver))
    resolved = f"{ver.value // 10000}.{ver.value // 100 % 100}.{ver.value % 100}"
except AttributeError:
    resolved = "none in the global scope"
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "libnccl" in line})
print(f"{tag} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} devices={n} "
      f"LOCAL_RANK {local} -> {os.environ['LOCAL_RANK']}; NCCL resolved {resolved}; "
      f"torch built with {torch.cuda.nccl.version()}; mapped {mapped}", flush=True)
sys.argv = args
runpy.run_path(args[0], run_name="__main__")
