#!/usr/bin/env bash
# All-reduce side by side on the GPU machine, in one run: `gotrain bench
# allreduce` (one process per GPU), torch.distributed through torchrun (the
# anchor in anchors/torch_allreduce.py), and nccl-tests' all_reduce_perf when
# it is installed. Writes RESULTS_DIR/gpu-allreduce-<date>.md (default
# bench/results) with the table, the ratios and the machine.
#
# Run from the repository root after `make gpu` (bin/gotrain; BIN=dir for another place), e.g.
#   GPUS=2 bash bench/gpu_allreduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

# BIN is where `make gpu` put the binaries.
BIN=${BIN:-bin}

GPUS=${GPUS:-2}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
TORCHRUN=${TORCHRUN:-/opt/torch/.venv/bin/torchrun}
date=$(date -u +%Y-%m-%d)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$RESULTS_DIR"

echo "== gotrain bench allreduce --gpus $GPUS" >&2
"$BIN"/gotrain bench allreduce --gpus "$GPUS" --json >"$work/gotrain.json"
echo "== gotrain bench allreduce, small sizes, 1000 iterations" >&2
"$BIN"/gotrain bench allreduce --gpus "$GPUS" --min 8 --max 32K --iters 1000 --warmup 100 --json >"$work/gotrain-small.json"

echo "== torchrun torch_allreduce.py" >&2
"$TORCHRUN" --standalone --nproc-per-node "$GPUS" bench/anchors/torch_allreduce.py >"$work/torch.txt" 2>"$work/torch.err" ||
	{ cat "$work/torch.err" >&2; echo "torch anchor failed" >&2; }

nccltests=$(command -v all_reduce_perf || ls /opt/nccl-tests/build/all_reduce_perf /usr/local/bin/all_reduce_perf 2>/dev/null | head -1 || true)
if [[ -n "$nccltests" ]]; then
	echo "== $nccltests -t $GPUS -g 1" >&2
	"$nccltests" -b 8 -e 2G -f 4 -t "$GPUS" -g 1 -w 5 -n 20 >"$work/nccltests.txt" 2>&1 || true
fi

{
	echo "machine: $(hostname), $(nproc) CPUs"
	nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
	echo "gpus used: $GPUS"
	echo "nccl (system): $(dpkg-query -W -f='${Version}' libnccl2 2>/dev/null || echo unknown)"
	echo "gotrain: $("$BIN"/gotrain version 2>/dev/null || echo unknown)"
	echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null || echo unknown)"
	nvidia-smi topo -m 2>/dev/null | head -n $((GPUS + 1)) | sed 's/^/topo: /'
} >"$work/machine.txt"

out="$RESULTS_DIR/gpu-allreduce-$date.md"
"$PY" bench/merge_allreduce.py "$work" "$date" >"$out"
cat "$out"
echo "wrote $out" >&2
