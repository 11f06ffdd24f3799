#!/usr/bin/env bash
# Data-parallel MLP training, PyTorch DDP against gotrain, side by side in one
# run on the GPU machine: the anchor (bench/anchors/torch_ddp_mlp.py under
# torchrun) and examples/mlp (--mode synthetic, the same shape: 1024→4096→
# 4096→4096→1024, batch 512 per GPU, fp32 without TF32, SGD), each on 1 and N
# GPUs, interleaved ROUNDS times. Writes a Markdown table with the median step
# times, gotrain's one-GPU step time against PyTorch's, and each side's
# weak-scaling efficiency t1/tN, to RESULT (default
# bench/results/mlp-ddp-<date>.md), plus the raw lines beside it.
#
#   make gpu                                  # on the development machine
#   bash bench/mlp_ddp.sh                     # on the GPU machine
#   BIN=bin GPUS="1 2" ROUNDS=3 EXTRA="--precision bf16" bash bench/mlp_ddp.sh
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin}
PY=${PY:-/opt/torch/.venv/bin/python}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
GPUS=${GPUS:-"1 $NGPU"}
ROUNDS=${ROUNDS:-3}
EXTRA=${EXTRA:-}
RESULT=${RESULT:-bench/results/mlp-ddp-$(date -u +%Y-%m-%d).md}
RAW=${RESULT%.md}.raw.txt
mkdir -p "$(dirname "$RESULT")"
: >"$RAW"

torch_run() { # GPUS
	timeout -k 5 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$1" \
		bench/anchors/torch_ddp_mlp.py 2>&1 | grep '^DDP' | tail -1
}
gotrain_run() { # GPUS [mlp flags]
	local n=$1
	shift
	timeout -k 5 180 "$BIN/gotrain" launch --nproc-per-node "$n" --backend nccl -- \
		"$BIN/mlp" --mode synthetic "$@" 2>&1 | grep 'gotrain world=' | sed 's/^\[rank 0\] //' | tail -1
}
ms() { sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p'; }

declare -A T G
for round in $(seq "$ROUNDS"); do
	for n in $GPUS; do
		line=$(torch_run "$n")
		echo "round $round torch $n: $line" | tee -a "$RAW"
		T[$n]+="$(echo "$line" | ms) "
		line=$(gotrain_run "$n" $EXTRA)
		echo "round $round gotrain $n: $line" | tee -a "$RAW"
		G[$n]+="$(echo "$line" | ms) "
	done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
first=${GPUS%% *}
t1=$(echo "${T[$first]}" | median)
g1=$(echo "${G[$first]}" | median)
{
	echo "# Data-parallel MLP: PyTorch DDP vs gotrain ($(date -u +%Y-%m-%dT%H:%MZ))"
	echo
	echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) × $NGPU; $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1) driver;" \
		"torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)."
	echo "Model 1024→4096→4096→4096→1024 (42.0 M parameters), batch 512 per GPU, fp32 (no TF32), SGD lr 1e-3;"
	echo "median of $ROUNDS interleaved runs of 100 timed steps after 10 warm-up steps. gotrain flags: \`--mode synthetic $EXTRA\`."
	echo
	echo "| GPUs | PyTorch DDP ms/step | gotrain ms/step | gotrain / PyTorch | PyTorch scaling t1/tN | gotrain scaling t1/tN |"
	echo "|---:|---:|---:|---:|---:|---:|"
	for n in $GPUS; do
		t=$(echo "${T[$n]}" | median)
		g=$(echo "${G[$n]}" | median)
		awk -v n="$n" -v t="$t" -v g="$g" -v t1="$t1" -v g1="$g1" 'BEGIN {
			printf "| %d | %.3f | %.3f | %.3f | %.1f %% | %.1f %% |\n", n, t, g, g/t, 100*t1/t, 100*g1/g }'
	done
	echo
	echo "Raw runs: \`$(basename "$RAW")\`. Reproduce: \`make gpu\` here, then on the GPU machine \`bash bench/mlp_ddp.sh\`."
} >"$RESULT"
cat "$RESULT"
