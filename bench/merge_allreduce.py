"""Merges one run of bench/gpu_allreduce.sh into a Markdown report.

Usage: python3 merge_allreduce.py WORKDIR DATE > report.md
WORKDIR holds gotrain.json and gotrain-small.json (gotrain bench --json),
torch.txt (anchors/torch_allreduce.py), nccltests.txt (optional) and
machine.txt.
"""
import json
import os
import sys

work, date = sys.argv[1], sys.argv[2]


def read(name):
    p = os.path.join(work, name)
    return open(p).read() if os.path.exists(p) else ""


def size(n):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


gotrain = {r["bytes"]: r for r in json.loads(read("gotrain.json") or "[]")}
small = {r["bytes"]: r for r in json.loads(read("gotrain-small.json") or "[]")}

torch, torch_header = {}, ""
for line in read("torch.txt").splitlines():
    if line.startswith("#"):
        torch_header = line.lstrip("# ").strip()
        continue
    f = line.split()
    if len(f) == 4 and f[0].isdigit():
        torch[int(f[0])] = {"time_us": float(f[1]), "busbw_gbps": float(f[3])}

# nccl-tests: size count type redop root time algbw busbw #wrong (out of place) ...
nccltests = {}
for line in read("nccltests.txt").splitlines():
    f = line.split()
    if len(f) >= 9 and f[0].isdigit() and f[2] == "float":
        try:
            nccltests[int(f[0])] = {"time_us": float(f[5]), "busbw_gbps": float(f[7])}
        except ValueError:
            pass

# nccl-tests 2.19.6, all_reduce_perf -g 2, NCCL 2.28.3, measured on the same
# kind of machine on 2026-11-29 (shared/GPU.md); used when nccl-tests is not
# installed where this ran.
baseline = {8: (15.3, None), 8 << 10: (13.6, 0.6), 2 << 20: (29.9, 70), 32 << 20: (139, 241),
            512 << 20: (1716, 313), 2 << 30: (6342, 339)}


def fmt(v, digits=1):
    return "—" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return "—" if not a or not b else f"{a / b:.2f}"


print(f"# All-reduce on {date}: gotrain vs torch.distributed vs nccl-tests\n")
print("float32 sum, out of place, one process per GPU. gotrain: `bin/gotrain bench allreduce --gpus N --json`"
      " (20 timed iterations after 5 warm-up, CUDA events, mean over ranks). torch: `torchrun --nproc-per-node N"
      " bench/anchors/torch_allreduce.py` (in place, 50 or 10 iterations).")
live = bool(nccltests)
print("nccl-tests: " + ("`all_reduce_perf -b 8 -e 2G -f 4 -t N -g 1 -w 5 -n 20`, this run." if live else
      "not installed here; the column shows the baseline of shared/GPU.md (`all_reduce_perf -g 2`, NCCL 2.28.3, 2026-11-29)."))
print("\n## Machine\n\n```")
print(read("machine.txt").strip())
if torch_header:
    print("torch anchor: " + torch_header)
print("```\n")
print("## All-reduce\n")
print("| size | gotrain µs | gotrain busbw GB/s | #wrong | torch µs | torch busbw | nccl-tests µs | nccl-tests busbw | busbw gotrain/torch | busbw gotrain/nccl-tests | time torch/gotrain |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted(gotrain):
    g = gotrain[b]
    t = torch.get(b, {})
    if live:
        n = nccltests.get(b, {})
        nt, nb = n.get("time_us"), n.get("busbw_gbps")
    else:
        nt, nb = baseline.get(b, (None, None))
    print(f"| {size(b)} | {g['time_us']:.2f} | {g['busbw_gbps']:.1f} | {g['wrong']} | {fmt(t.get('time_us'))} | {fmt(t.get('busbw_gbps'))} | "
          f"{fmt(nt)} | {fmt(nb)} | {ratio(g['busbw_gbps'], t.get('busbw_gbps'))} | {ratio(g['busbw_gbps'], nb)} | {ratio(t.get('time_us'), g['time_us'])} |")

if small:
    print("\n## Small messages, 1000 iterations (gotrain)\n")
    print("`bin/gotrain bench allreduce --gpus N --min 8 --max 32K --iters 1000 --warmup 100`\n")
    print("| size | time µs | #wrong |")
    print("|---:|---:|---:|")
    for b in sorted(small):
        print(f"| {size(b)} | {small[b]['time_us']:.2f} | {small[b]['wrong']} |")

big = gotrain.get(2 << 30)
print("\n## Targets\n")
if big:
    ok = big["busbw_gbps"] >= 0.98 * 339
    print(f"- busbw at 2 GiB: {big['busbw_gbps']:.1f} GB/s; target ≥ {0.98 * 339:.1f} (0.98 × nccl-tests' 339): {'met' if ok else 'NOT met'}")
s8 = small.get(8) or gotrain.get(8)
if s8:
    print(f"- 8-byte all-reduce: {s8['time_us']:.2f} µs; target ≤ 10 µs: {'met' if s8['time_us'] <= 10 else 'NOT met'}")
if read("nccltests.txt"):
    print("\n## nccl-tests output\n\n```")
    print(read("nccltests.txt").rstrip())
    print("```")
