#!/usr/bin/env bash
# Crash -> every rank back at its first collective of the new generation, in
# one run on one machine, three ways:
#   gotrain, process restart:  all workers are stopped and started again
#   gotrain, in process:       survivors recover inside worker.Run; only the
#                              dead rank's process is started again
# (each with gotrain launch's default --standby=auto, new processes being
# warmed-up spares, and with --standby=off, new processes from scratch)
#   torchrun --max-restarts 1: the anchor anchors/torch_restart.py
# In the first generation rank 1 dies (exit 1) one second after the first
# all-reduce of 4 MiB, writing the time of death; in the next generation each
# rank prints how long after the death its first all-reduce completed
# (testprog restart mode: "RESTART ... recovered_in=S"). gotrain's number is
# the slowest rank's; torchrun's anchor prints rank 0's.
#
# Build on the development machine, then run from the repository root there:
#   go build -o bin/gotrain ./cmd/gotrain && go build -o bin/testprog ./internal/testing/integration/testprog
#   BACKEND=nccl GPUS=2 RUNS=3 bash bench/restart.sh
# Writes RESULTS_DIR/restart-<date>-<backend>.md (default bench/results).
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin}
GPUS=${GPUS:-2}
RUNS=${RUNS:-3}
BACKEND=${BACKEND:-nccl}
TORCH=${TORCH:-1}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
TORCHRUN=${TORCHRUN:-/opt/torch/.venv/bin/torchrun}
date=$(date -u +%Y-%m-%d)
# Raw logs stay beside the results, so a run cut short still tells what happened.
work="$RESULTS_DIR/restart-raw-$date-$BACKEND"
mkdir -p "$RESULTS_DIR" "$work"
: >"$work/timing.txt"

# slowest FILE: the largest recovered_in of the RESTART lines in FILE.
slowest() { grep -o 'recovered_in=[0-9.]*' "$1" | cut -d= -f2 | sort -g | tail -1; }

declare -A results
run_gotrain() { # NAME STANDBY [testprog flags]
	local name=$1 standby=$2
	shift 2
	for i in $(seq "$RUNS"); do
		rm -f "$work/mark"
		timeout -k 5 40 "$BIN"/gotrain launch --nproc-per-node "$GPUS" --backend "$BACKEND" --max-restarts 1 --grace-period 5s \
			--standby="$standby" -- "$BIN"/testprog restart --mark "$work/mark" "$@" >"$work/$name-$i.out" 2>"$work/$name-$i.err"
		local rc=$? t
		t=$(slowest "$work/$name-$i.out")
		echo "$name run $i: exit $rc, slowest rank back after ${t:-?} s" >&2
		grep -E 'RESTART|BREAKDOWN' "$work/$name-$i.out" >&2
		grep BREAKDOWN "$work/$name-$i.out" | sed "s/^/$name run $i: /" >>"$work/breakdown.txt"
		grep -h TIMING "$work/$name-$i.out" | sed "s/^\[rank [0-9]*\] /$name-$i /" >>"$work/timing.txt"
		((rc == 0)) || tail -5 "$work/$name-$i.err" >&2
		results[$name]+="${t:-fail} "
	done
}

# gotrain launch's default, --standby=auto, keeps a warmed-up spare process
# per GPU on the NCCL backend; --standby=off starts every new process from
# scratch.
run_gotrain "gotrain-process-restart" auto
run_gotrain "gotrain-in-process" auto --inprocess
run_gotrain "gotrain-process-restart-nostandby" off
run_gotrain "gotrain-in-process-nostandby" off --inprocess

if ((TORCH)); then
	for i in $(seq "$RUNS"); do
		rm -f /tmp/gt_crash_ts
		timeout -k 5 90 "$TORCHRUN" --standalone --nproc-per-node "$GPUS" --max-restarts 1 bench/anchors/torch_restart.py \
			>"$work/torch-$i.out" 2>"$work/torch-$i.err"
		rc=$?
		t=$(grep -o 'recovered_in=[0-9.]*' "$work/torch-$i.out" | cut -d= -f2 | head -1)
		echo "torchrun run $i: exit $rc, rank 0 back after ${t:-?} s" >&2
		((rc == 0)) || tail -5 "$work/torch-$i.err" >&2
		results[torchrun]+="${t:-fail} "
	done
fi

out="$RESULTS_DIR/restart-$date-$BACKEND.md"
{
	echo "# Crash -> first collective of the new generation ($date, backend $BACKEND, $GPUS ranks)"
	echo
	echo "machine: $(hostname), $(nproc) CPUs"
	nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
	echo "gotrain: $("$BIN"/gotrain version 2>/dev/null | head -1)"
	echo
	echo "Rank 1 dies (exit 1) 1 s after the first all-reduce (4 MiB float32); time from its death to"
	echo "the first all-reduce of the next generation completing, seconds, $RUNS runs each"
	echo "(gotrain: slowest rank; torchrun anchor: rank 0)."
	echo
	echo "| launcher | runs (s) | median (s) |"
	echo "|---|---|---|"
	for k in gotrain-process-restart gotrain-in-process gotrain-process-restart-nostandby gotrain-in-process-nostandby torchrun; do
		[[ -n "${results[$k]:-}" ]] || continue
		med=$(echo "${results[$k]}" | tr ' ' '\n' | grep -v '^$' | grep -v fail | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}')
		echo "| $k | ${results[$k]}| $med |"
	done
	echo
	echo "Where the time went (seconds from the death; negative: before it): process start (main),"
	echo "worker.Init done (init), the generation's communicator ready (comm)."
	echo
	echo '```'
	cat "$work/breakdown.txt" 2>/dev/null
	echo '```'
	echo
	echo "Each step of the new generation (testprog TIMING lines; bench/restart_timing.awk):"
	echo
	awk -f bench/restart_timing.awk "$work/timing.txt"
	echo
	echo "Reproduce: BACKEND=$BACKEND GPUS=$GPUS RUNS=$RUNS bash bench/restart.sh"
} >"$out"
cat "$out"
echo "wrote $out" >&2
