# The PyTorch snapshot tier against its references, in one process and one
# run: a pinned-host copy of the same tensors (the floor), clone() (CPU),
# torch.save to /dev/shm, and gotrain.snapshot / restore_into / restore.
# Run it as rank 0 under a gotrain agent:
#
#   gotrain launch --nproc-per-node 1 -- python3 bench/torch_snapshot.py --device cuda --layers 8
#   gotrain launch --nproc-per-node 1 --backend cpu -- python3 bench/torch_snapshot.py --device cpu --mib 1024
#
# --layers N: N × Linear(4096, 4096) + Adam (8: 1.61 GB of state, 60:
# 12.1 GB); --mib M on the CPU: a state_dict of M MiB of float32 tensors.
# Prints one "result" line per figure (seconds, GB/s, ratio to the
# reference) and "identical True" when every restored tensor equals the
# original bit for bit. Exit status 1 when a restore is not identical.
import argparse, os, sys, time

import torch
import gotrain

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--mib", type=int, default=1024)
ap.add_argument("--repeat", type=int, default=4)
ap.add_argument("--save", action="store_true", help="also time torch.save to /dev/shm")
args = ap.parse_args()
dev = torch.device(args.device)
gpu = dev.type == "cuda"


def sync():
    if gpu:
        torch.cuda.synchronize()


def build():
    torch.manual_seed(0)
    if args.device == "cpu" and args.layers == 0:
        n = args.mib * (1 << 20) // 4 // 16
        return {"w%d" % i: torch.randn(n) for i in range(16)}, None
    m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(args.layers)]).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    return m, opt


model, opt = build()
if opt is not None:
    model(torch.randn(16, 4096, device=dev)).sum().backward()
    opt.step()
    state = {"model": model, "opt": opt}
    tensors = [t for t in model.state_dict().values()] + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
else:
    state = model
    tensors = list(model.values())
nbytes = sum(t.numel() * t.element_size() for t in tensors)
gb = nbytes / 1e9
print("state %.3f GB in %d tensors on %s; torch %s; %s" % (gb, len(tensors), dev, torch.__version__,
      torch.cuda.get_device_name() if gpu else os.uname().machine), flush=True)


def best(f, n=args.repeat):
    times = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times), times


def result(name, secs, ref=None, refname=""):
    extra = " ratio %.2f× %s" % (secs / ref, refname) if ref else ""
    print("result %-34s %8.4f s %8.2f GB/s%s" % (name, secs, gb / secs, extra), flush=True)


# References.
if gpu:
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def floor():
        for d, s in zip(pinned, tensors):
            d.copy_(s, non_blocking=True)
    ref, _ = best(floor)
    result("pinned copy (floor)", ref)
    refname = "the pinned copy"
else:
    ref, _ = best(lambda: [t.clone() for t in tensors])
    result("clone()", ref)
    refname = "clone()"
if args.save:
    path = "/dev/shm/gotrain-bench-%d.pt" % os.getpid()
    secs, _ = best(lambda: torch.save({"model": model.state_dict(), "opt": opt.state_dict()} if opt else model, path), 2)
    result("torch.save to /dev/shm", secs, ref, refname)
    os.unlink(path)

# The tier: the call (what the training loop waits for on the CPU), the
# step stall (until the GPU's queue is past the copy), the whole snapshot
# (until the agent holds it).
calls, stalls, wholes = [], [], []
for i in range(args.repeat + 2):
    sync()
    t0 = time.perf_counter()
    p = gotrain.snapshot(state, i + 1)
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    p.wait()
    t3 = time.perf_counter()
    calls.append(t1 - t0); stalls.append(t2 - t0); wholes.append(t3 - t0)
print("snapshot calls (s): %s" % " ".join("%.4f" % x for x in calls))
print("snapshot stalls (s): %s" % " ".join("%.4f" % x for x in stalls))
print("snapshot wholes (s): %s" % " ".join("%.4f" % x for x in wholes), flush=True)
warm = slice(2, None)  # the first two fill the two buffers (first touch, CUDA registration)
result("snapshot: first (cold)", wholes[0], ref, refname)
result("snapshot: call returns", min(calls[warm]), ref, refname)
result("snapshot: step stall", min(stalls[warm]), ref, refname)
result("snapshot: held by the agent", min(wholes[warm]), ref, refname)

# Restores: into the existing tensors of a fresh model and optimizer, and
# as new tensors.
original = [t.detach().clone() for t in tensors]
fresh, fopt = build()
if fopt is not None:
    with torch.no_grad():
        for p_ in fresh.parameters():
            p_.zero_()
    target = {"model": fresh, "opt": fopt}
else:
    for t in fresh.values():
        t.zero_()
    target = fresh
times = []
for _ in range(args.repeat):
    sync()
    t0 = time.perf_counter()
    got = gotrain.restore_into(target)
    sync()
    times.append(time.perf_counter() - t0)
    assert got is not None and got[1] == args.repeat + 2, got
result("restore_into existing tensors", min(times), ref, refname)
if fopt is not None:
    now = [t for t in fresh.state_dict().values()] + [v for s in fopt.state.values() for v in s.values() if torch.is_tensor(v)]
else:
    now = list(fresh.values())
same = len(now) == len(original) and all(torch.equal(a, b) for a, b in zip(now, original))
got = None


def as_new():
    global got
    got = None  # the previous restore's tensors go first, as clone()'s do
    got = gotrain.restore(map_location=str(dev))


secs, _ = best(as_new)
result("restore as new tensors", secs, ref, refname)
got = None
print("identical", same, flush=True)
sys.exit(0 if same else 1)
