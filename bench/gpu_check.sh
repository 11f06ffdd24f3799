#!/usr/bin/env bash
# Everything GPU that CI cannot run, in one go on the GPU machine: the GPU test
# binaries `make gpu` built (bin/*.test), the hand-off overhead of the NCCL
# backend, `gotrain bench` for every collective and several dtypes and ops
# (results checked), the all-reduce comparison of bench/gpu_allreduce.sh,
# examples/mlp's GPU tests, one quick restart run of each mode, and, where
# python has torch, an unchanged PyTorch program under gotrain launch (a
# restart, and a hang named from NCCL's RAS).
# Writes REPORT_DIR/report.md (default bench/results/gpu-check) with one log
# per step beside it, and exits non-zero when anything failed.
#
#   make gpu                        # on the development machine
#   bash bench/gpu_check.sh         # on the GPU machine, from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Here every GPU test must run: a GPU test that would skip (no driver, too
# few GPUs, no NCCL) fails instead (internal/testing/gputest).
export GOTRAIN_REQUIRE_GPU=${GOTRAIN_REQUIRE_GPU:-1} # 0 only on a machine with fewer GPUs than the tests want

# BIN is where `make gpu` put the binaries.
BIN=${BIN:-bin}

REPORT_DIR=${REPORT_DIR:-bench/results/gpu-check}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
mkdir -p "$REPORT_DIR"
report="$REPORT_DIR/report.md"
failed=0

# gotest_problem LOG KIND: why the log of a go test binary (KIND tests: run
# with -test.v; bench: benchmarks only) does not show a pass, or nothing.
# Exit 0 is not enough: a binary whose tests all skipped, or that ran none,
# exits 0 too.
gotest_problem() {
	local log=$1 kind=$2 n
	n=$(grep -c -- '--- SKIP' "$log")
	if ((n > 0)); then
		echo "$n test(s) skipped"
	elif grep -q 'no tests to run' "$log"; then
		echo "no tests to run"
	elif grep -q -- '--- FAIL' "$log"; then
		echo "a test failed"
	elif [[ $kind == tests ]] && ! grep -qE -- '^(--- PASS|ok )' "$log"; then
		echo "no test passed"
	elif [[ $kind == bench ]] && ! grep -qE '^Benchmark.* ns/op' "$log"; then
		echo "no benchmark ran"
	fi
}

# step [--tests|--bench] NAME CMD...: runs CMD, logs it to NAME.log, records
# PASS/FAIL. With --tests or --bench, CMD runs a go test binary and passes
# only when its output shows tests (benchmarks) that ran and passed.
step() {
	local kind=
	case $1 in
	--tests) kind=tests; shift ;;
	--bench) kind=bench; shift ;;
	esac
	local name=$1
	shift
	local start=$SECONDS
	echo "== $name: $*" >&2
	timeout -k 10 "${STEP_TIMEOUT:-240}" "$@" >"$REPORT_DIR/$name.log" 2>&1
	local rc=$?
	local verdict=PASS problem=
	if [[ -n $kind ]]; then
		problem=$(gotest_problem "$REPORT_DIR/$name.log" "$kind")
	fi
	if ((rc != 0)); then
		verdict="FAIL (exit $rc)"
		failed=1
	elif [[ -n $problem ]]; then
		verdict="FAIL ($problem)"
		failed=1
	fi
	printf '| %s | %s | %ds | `%s` |\n' "$name" "$verdict" $((SECONDS - start)) "$*" >>"$REPORT_DIR/steps.md"
	tail -n 3 "$REPORT_DIR/$name.log" >&2
}

# skip NAME WHY: records a step that cannot run on this machine, and why.
skip() {
	echo "== $1: skipped: $2" >&2
	printf '| %s | SKIP (%s) | | |\n' "$1" "$2" >>"$REPORT_DIR/steps.md"
}

: >"$REPORT_DIR/steps.md"
# The test binaries of `make gpu` (GPU_TEST_PKGS there), as package paths;
# each runs in its package's directory, as go test runs it.
GPU_TEST_PKGS=${GPU_TEST_PKGS:-nccl gpu/cudadrv worker/ncclcomm worker/pairreduce worker/cudago}
# Tests that skip on a GPU machine by design, left out here (CI runs them):
# the no-driver checks (TestCallsBeforeLoad and TestLaunchBeforeLoad need the
# driver not loaded yet, TestPrewarmWithoutDriverNewReportsIt no driver at
# all) and TestGotrainBinaryDoesNotLinkCu, which needs the go tool.
NOT_ON_GPU=${NOT_ON_GPU:-'^(TestCallsBeforeLoad|TestLaunchBeforeLoad|TestPrewarmWithoutDriverNewReportsIt|TestGotrainBinaryDoesNotLinkCu)$'}
for pkg in $GPU_TEST_PKGS; do
	name=$(echo "$pkg" | tr / _)
	if [[ ! -x $BIN/$name.test ]]; then
		echo "| test-$name | MISSING | | $BIN/$name.test: run make gpu |" >>"$REPORT_DIR/steps.md"
		failed=1
		continue
	fi
	step --tests "test-$name" bash -c 'cd "$1" && "$2" -test.v -test.count=1 -test.timeout 230s -test.skip "$3"' _ "$pkg" "$(readlink -f "$BIN/$name.test")" "$NOT_ON_GPU"
done
# The hand-off to a communicator's thread (internal/osthread, ncclcomm's executor).
if [[ -x "$BIN"/internal_osthread.test ]]; then
	step --bench bench-executor bash -c 'cd internal/osthread && "$1" -test.run "^$" -test.bench Executor -test.benchtime 2s' _ "$(readlink -f "$BIN"/internal_osthread.test)"
fi
for op in all_gather reduce_scatter broadcast; do
	step "bench-$op" "$BIN"/gotrain bench "$op" --gpus "$GPUS" --max 1G
done
step bench-allreduce-float64-avg "$BIN"/gotrain bench allreduce --gpus "$GPUS" --max 256M --dtype float64 --op avg
step bench-allreduce-int32-max "$BIN"/gotrain bench allreduce --gpus "$GPUS" --max 256M --dtype int32 --op max
step bench-allreduce-int64-min "$BIN"/gotrain bench allreduce --gpus "$GPUS" --max 256M --dtype int64 --op min
# A CPU-math program (host buffers staged through the GPU) on the NCCL backend.
if [[ -x "$BIN"/mnist && -n ${MNIST_DATA:-} ]]; then
	step mnist-nccl "$BIN"/gotrain launch --gpus "$GPUS" --backend nccl -- "$BIN"/mnist --data "$MNIST_DATA" --epochs 1 --limit 20000
fi
step bench-allreduce-compare env BIN="$BIN" GPUS="$GPUS" RESULTS_DIR="$REPORT_DIR" bash bench/gpu_allreduce.sh
# examples/mlp on the GPU (one step matches the CPU, ranks bitwise equal).
if [[ -x "$BIN"/examples_mlp.test ]]; then
	step --tests test-examples_mlp bash -c 'cd examples/mlp && "$1" -test.v -test.count=1' _ "$(readlink -f "$BIN"/examples_mlp.test)"
fi
# DataParallel on device gradients through an in-process recovery (the
# copy-engine transport on two GPUs of one node, NCCL otherwise).
if [[ -x "$BIN"/testprog ]]; then
	step dataparallel-recovery "$BIN"/gotrain launch --gpus "$GPUS" --backend nccl --max-restarts 1 -- "$BIN"/testprog dataparallel
fi
# Restarts (both modes, with the default hot standbys): one quick run each.
if [[ -x "$BIN"/testprog ]]; then
	step restart-quick env BIN="$BIN" GPUS="$GPUS" STANDBY=0 SPLIT_AB=0 BUDGET=30 RESULTS_DIR="$REPORT_DIR" bash bench/restart_quick.sh
fi
# PyTorch, unchanged, under gotrain launch: torchrun's set_device(LOCAL_RANK)
# idiom and a restart (the anchor), and a hang named from NCCL's RAS alone.
PY=${PY:-/opt/torch/.venv/bin/python}
# Both need two ranks. On one GPU the restart runs its two ranks on that
# GPU over gloo (anchors/torch_restart.py: NCCL before 2.30 cannot put two
# ranks on one GPU); the hang, which NCCL's RAS must name, is skipped.
if "$PY" -c 'import torch' 2>/dev/null; then
	if ((GPUS >= 2)); then
		step torch-restart bash -c 'rm -f /tmp/gt_crash_ts; "$1" launch --gpus "$2" --max-restarts 1 --grace-period 5s -- "$3" bench/anchors/torch_restart.py' _ "$BIN/gotrain" "$GPUS" "$PY"
		step torch-hang env BIN="$BIN" PY="$PY" RESULT="$REPORT_DIR/hang-torch.md" bash bench/hang_torch.sh
	else
		step torch-restart bash -c 'rm -f /tmp/gt_crash_ts; "$1" launch --nproc-per-node 2 --backend cpu --max-restarts 1 --grace-period 5s -- "$2" bench/anchors/torch_restart.py' _ "$BIN/gotrain" "$PY"
		skip torch-hang "needs 2 GPUs, this machine has $GPUS: the hang is named from NCCL's RAS, and NCCL before 2.30 cannot run two ranks on one GPU"
	fi
fi

{
	echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "$(hostname); $GPUS GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1);" \
		"NCCL $(dpkg-query -W -f='${Version}' libnccl2 2>/dev/null || echo '?')"
	echo
	echo "| step | result | took | command |"
	echo "|---|---|---:|---|"
	cat "$REPORT_DIR/steps.md"
	echo
	echo "## Test results"
	for log in "$REPORT_DIR"/test-*.log; do
		[[ -e $log ]] || continue
		echo
		echo "### $(basename "$log" .log)"
		echo
		echo '```'
		grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|PASS|FAIL|ok)|_test.go:[0-9]+:' "$log" | grep -v '^=== RUN' | head -n 200
		echo '```'
	done
	if [[ -e $REPORT_DIR/bench-executor.log ]]; then
		echo
		echo "## Hand-off to the communicator's thread"
		echo
		echo '```'
		grep -E '^Benchmark|^cpu:' "$REPORT_DIR/bench-executor.log"
		echo '```'
	fi
	if [[ -e $REPORT_DIR/mnist-nccl.log ]]; then
		echo
		echo "## MNIST (CPU math, host buffers) on --backend nccl"
		echo
		echo '```'
		tail -n 12 "$REPORT_DIR/mnist-nccl.log"
		echo '```'
	fi
	echo
	echo "## gotrain bench"
	for log in "$REPORT_DIR"/bench-a*.log "$REPORT_DIR"/bench-r*.log "$REPORT_DIR"/bench-b*.log; do
		[[ -e $log && $log != *compare* && $log != *executor* ]] || continue
		echo
		echo '```'
		grep -v '^\[rank' "$log"
		echo '```'
	done
} >"$report"
rm -f "$REPORT_DIR/steps.md"
echo "wrote $report" >&2
exit $failed
