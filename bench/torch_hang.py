# A PyTorch job that hangs: every rank all-reduces a tensor each step; at
# step HANG_STEP rank HANG_RANK stops calling all_reduce (it sleeps), so the
# others wait in that all-reduce for ever. bench/hang_torch.sh runs it under
# gotrain launch, which must name the rank and the collective from NCCL's
# RAS alone (the program does not use gotrain's worker library).
import os, time, torch, torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
# gotrain launch gives each worker one GPU (CUDA_VISIBLE_DEVICES); torchrun
# leaves them all visible.
torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else int(os.environ["LOCAL_RANK"]))
hang_step = int(os.environ.get("HANG_STEP", "50"))
hang_rank = int(os.environ.get("HANG_RANK", "1"))
x = torch.ones(1 << 20, device="cuda")
step = 0
while True:
    if rank == hang_rank and step == hang_step:
        print(f"FAULT rank {rank} stops calling all_reduce at step {step}", flush=True)
        time.sleep(3600)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    step += 1
    if step % 20 == 0 and rank == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.05)
