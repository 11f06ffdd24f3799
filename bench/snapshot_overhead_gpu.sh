#!/usr/bin/env bash
# What an in-memory snapshot costs a GPU
# training step: examples/mlp's synthetic step on one GPU under gotrain
# launch, its parameters and momentum handed to the agent's memory from the
# device every N steps (N=0: never), interleaved rounds, one line per run.
# The step's path pays a stream sync and the device→host copy into
# page-locked shared memory; the hand-over to the agent runs beside the
# next steps (a Save while one is in flight is skipped).
#
#   make gpu                                    # on the development machine
#   BIN=bin bash bench/snapshot_overhead_gpu.sh # on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
BIN=${BIN:-bin}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-300}
EVERY=${EVERY:-"0 1 10 100"}
# name:hidden units: the 42 M-parameter MLP of the PyTorch anchor (336 MB
# of parameters and momentum) and one of 151 M parameters (1.2 GB).
SHAPES=${SHAPES:-"mlp42m:4096 mlp151m:8192"}
for r in $(seq "$ROUNDS"); do
	for shape in $SHAPES; do
		name=${shape%%:*} hidden=${shape#*:}
		for n in $EVERY; do
			out=$("$BIN/gotrain" launch --nproc-per-node 1 --backend nccl -- "$BIN/mlp" --hidden "$hidden" --optimizer momentum \
				--steps "$STEPS" --warmup 20 --snapshot-every "$n" 2>&1) || { echo "round=$r shape=$name every=$n FAILED"; echo "$out" | tail -5; continue; }
			step=$(grep -o 'step_ms=[0-9.]*' <<<"$out" | head -1 || true)
			snap=$(grep -o 'snapshots every=.*' <<<"$out" || echo "snapshots none")
			params=$(grep -o 'params=[0-9]*' <<<"$out" | head -1 || true)
			echo "round=$r shape=$name $params every=$n $step $snap"
		done
	done
done
