#!/usr/bin/env bash
# Quick data-parallel MLP check on the GPU machine, gotrain only (PyTorch DDP
# on the same machine: 1 GPU 3.00 ms/step, 2 GPUs 3.58 ms/step,
# mlp-ddp-2026-11-30.md): examples/mlp --mode synthetic (1024→4096→4096→
# 4096→1024, batch 512 per GPU, fp32, SGD) once on 1 GPU and on 2 GPUs with
# the communication variants, each STEPS timed steps after WARMUP; prints
# ms/step and the scaling t1/t2 (t1: the 1-GPU default run) per variant,
# then, if time is left, the GPU tests that DeferUpdate keeps the weights
# bitwise. Every run has its own timeout and the whole stays within BUDGET
# seconds (runs that would not fit are skipped and say so). Data on stdout.
#
#   make gpu                                  # on the development machine
#   BIN=bin bash bench/mlp_quick.sh           # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1

BIN=${BIN:-bin}
STEPS=${STEPS:-200}
WARMUP=${WARMUP:-20}
MLP_EXTRA=${MLP_EXTRA:-} # flags for every run, e.g. --ptx FILE
TRACE=${TRACE:-3}  # each run's last TRACE steps are traced (CUDA events; no visible cost)
BUDGET=${BUDGET:-90} # seconds for everything
RUN_TIMEOUT=${RUN_TIMEOUT:-12}
start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
fits() { awk -v e="$(elapsed)" -v b="$BUDGET" -v need="$1" 'BEGIN { exit !(e + need <= b) }'; }

for f in "$BIN/gotrain" "$BIN/mlp"; do
	[ -x "$f" ] || { echo "missing $f: run make gpu and carry bin/" >&2; exit 1; }
done
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "# gotrain MLP quick check $(date -u +%Y-%m-%dT%H:%MZ): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) × $NGPU;" \
	"$STEPS timed steps after $WARMUP; PyTorch DDP reference 3.00 / 3.58 ms (83.8 %)"

LAST=""
run() { # NAME GPUS [mlp flags]: sets LAST to ms/step ("" on failure)
	local name=$1 n=$2 out line
	shift 2
	LAST=""
	if ! fits "$RUN_TIMEOUT"; then
		printf '%-34s gpus=%d  skipped (%.0fs of %ss budget used)\n' "$name" "$n" "$(elapsed)" "$BUDGET"
		return
	fi
	out=$(timeout -k 2 "$RUN_TIMEOUT" "$BIN/gotrain" launch --nproc-per-node "$n" --backend nccl -- \
		"$BIN/mlp" --mode synthetic --steps "$STEPS" --warmup "$WARMUP" --trace "$TRACE" ${MLP_EXTRA:-} "$@" 2>&1)
	local rc=$?
	line=$(echo "$out" | grep 'gotrain world=' | sed 's/^\[rank 0\] //' | tail -1)
	LAST=$(echo "$line" | sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p')
	if [ -z "$LAST" ]; then
		printf '%-34s gpus=%d  FAILED rc=%d:\n' "$name" "$n" "$rc"
		echo "$out" | tail -5 | sed 's/^/    /'
		return
	fi
	local agree
	agree=$(echo "$line" | sed -n 's/.*ranks_agree=\([a-z/]*\).*/\1/p')
	local transport
	transport=$(echo "$line" | sed -n 's/.*transport=\([a-z-]*\).*/\1/p')
	agree="$agree transport=${transport:-?}"
	if [ -n "${T1:-}" ]; then
		printf '%-34s gpus=%d  %7.3f ms/step  scaling %5.1f %%  ranks_agree=%s  (%ss)\n' "$name" "$n" "$LAST" \
			"$(awk -v a="$T1" -v b="$LAST" 'BEGIN { print 100 * a / b }')" "$agree" "$(elapsed)"
	else
		printf '%-34s gpus=%d  %7.3f ms/step  ranks_agree=%s  (%ss)\n' "$name" "$n" "$LAST" "$agree" "$(elapsed)"
	fi
	echo "    $line"
	echo "$out" | grep 'trace_summary rank=0' | sed 's/^\[rank [0-9]*\] /    /'
	if [ -n "${TRACE_DIR:-}" ]; then
		mkdir -p "$TRACE_DIR" && echo "$out" >"$TRACE_DIR/$name.txt"
	fi
}

T1=""
run "1gpu-default" 1
T1=$LAST
[ -n "$T1" ] || echo "no 1-GPU time: scaling not computed"
if [ "$NGPU" -lt 2 ]; then
	echo "only $NGPU GPU(s): no 2-GPU runs"
	exit 0
fi
# examples/mlp's defaults: weight gradients first (--weight-grad-first),
# each bucket's optimizer step on a stream of its own of normal priority,
# and --transport auto, which for two ranks of one node is copy-engine (each
# GPU copies its buckets into the other's memory, a small kernel adds them).
# Against them: NCCL's all-reduce with the same schedule (the default before
# 2026-11-30 session 3) and its variants; the copy engines with backward's
# plain order, other bucket sizes, the update stream at high priority.
run "2gpu-default" 2
run "2gpu-nccl" 2 --transport nccl
run "2gpu-ce-unfused" 2 --transport copy-engine --fused-sum=false
run "2gpu-ce-bucket10" 2 --transport copy-engine --bucket-mb 10
run "2gpu-ce-bucket40" 2 --transport copy-engine --bucket-mb 40
run "2gpu-ce-first-halves" 2 --transport copy-engine --chunk-first-mb 8 --bucket-mb 8
run "2gpu-default-again" 2

# DeferUpdate keeps the weights bitwise (GPU tests, 2 GPUs), if time is left.
if [ -x "$BIN/examples_mlp.test" ] && fits 15; then
	left=$(awk -v e="$(elapsed)" -v b="$BUDGET" 'BEGIN { printf "%d", b - e - 1 }')
	echo "# examples_mlp.test -test.run 'DeferUpdate|RanksIdentical|StepMatches' (timeout ${left}s)"
	MLP_PTX=${MLP_PTX:-} timeout -k 2 "$left" "$BIN/examples_mlp.test" -test.run 'DeferUpdate|RanksIdentical|StepMatches' -test.v 2>&1 |
		grep -E '^(--- |ok|FAIL|PASS|panic)' | head -20
else
	echo "# GPU tests skipped (no $BIN/examples_mlp.test or no time left: $(elapsed)s used)"
fi
echo "# total $(elapsed)s"
