#!/usr/bin/env bash
# The PyTorch snapshot tier on the GPU machine: bench/torch_snapshot.py
# under gotrain launch for the 1.6 GB and 12 GB states of 8 and 60 ×
# Linear(4096, 4096) + Adam, beside its references in the same process
# (pinned copy, torch.save to /dev/shm for the small one).
#
#   go build -o bin/gotrain ./cmd/gotrain        # on the development machine
#   bash bench/torch_snapshot_gpu.sh              # on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
BIN=${BIN:-bin}
PY=${PY:-python3}
LAYERS=${LAYERS:-"8 60"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
for n in $LAYERS; do
	save=""
	[ "$n" -le 8 ] && save=--save
	echo "== layers=$n"
	"$BIN/gotrain" launch --nproc-per-node 1 --snapshot-memory 40GiB -- "$PY" bench/torch_snapshot.py --device cuda --layers "$n" $save 2>&1 |
		grep -v 'restored the state of step'
done
