#!/usr/bin/env bash
# Unchanged PyTorch DDP (bench/anchors/torch_ddp_mlp.py) at 4 ranks on one
# GPU under gotrain launch --ranks-per-gpu 4, with PyTorch calling NCCL
# 2.30.7 (multi-rank-per-GPU) through bench/torch_shared_gpu.py --preload,
# beside the same program at 1 rank and at 4 ranks on PyTorch's own NCCL.
# One call on the GPU machine.
#
#   BIN=bin NCCL_LIB=/tmp/nccl230/libnccl.so.2 OUT_DIR=/tmp/ddp bash bench/torch_ddp_shared_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BIN=${BIN:-bin}
OUT_DIR=${OUT_DIR:-/tmp/torch-ddp-shared}
NCCL_LIB=${NCCL_LIB:?NCCL_LIB names libnccl.so.2 of NCCL >= 2.30}
export GOTRAIN_NCCL_LIBRARY=$NCCL_LIB NCCL_DEBUG=VERSION PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
sum=$OUT_DIR/ddp-summary.txt
: >"$sum"
step() {
	local name=$1 want=$2 limit=$3
	shift 3
	local start=$SECONDS
	timeout -k 5 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
	local rc=$?
	local verdict=PASS
	if [[ $want == nonzero ]]; then
		((rc != 0 && rc != 124 && rc != 137)) || verdict="FAIL (exit $rc, want a refusal)"
	elif ((rc != want)); then
		verdict="FAIL (exit $rc, want $want)"
	fi
	{
		echo "| $name | $verdict | $((SECONDS - start))s | \`$*\` |"
		grep -hoE 'DDP world=.*|NCCL version [^ ]*|torch_shared_gpu rank 0\].*|Duplicate GPU[^"]*|invalid device ordinal' "$OUT_DIR/$name.log" | sort | uniq -c | sed 's/^/    /'
	} >>"$sum"
}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "built with NCCL", torch.cuda.nccl.version())' >>"$sum" 2>&1
for cvd in 0 0,0 0,0,0,0; do
	echo "CUDA_VISIBLE_DEVICES=$cvd: torch.cuda.device_count() = $(CUDA_VISIBLE_DEVICES=$cvd python3 -c 'import torch; print(torch.cuda.device_count())' 2>&1 | tail -1)" >>"$sum"
done
step ddp-1 0 120 "$BIN"/gotrain launch --nproc-per-node 1 --backend nccl -- python3 bench/anchors/torch_ddp_mlp.py
# PyTorch's own NCCL (2.28.9) refuses the second rank of a GPU.
step ddp-4-torch-nccl nonzero 90 "$BIN"/gotrain launch --nproc-per-node 4 --ranks-per-gpu 4 --backend nccl --max-restarts 0 -- python3 bench/torch_shared_gpu.py bench/anchors/torch_ddp_mlp.py
step ddp-4-nccl230 0 200 "$BIN"/gotrain launch --nproc-per-node 4 --ranks-per-gpu 4 --backend nccl --max-restarts 0 -- python3 bench/torch_shared_gpu.py --preload "$NCCL_LIB" bench/anchors/torch_ddp_mlp.py
cat "$sum"
