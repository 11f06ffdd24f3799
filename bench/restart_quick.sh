#!/usr/bin/env bash
# One quick run of crash -> every rank back at its first collective of the new
# generation, with the per-phase breakdown: gotrain process restart and
# in-process recovery, once each, plus (SPLIT_AB=1, the default) the same two
# with NCCL_COMM_SPLIT_SHARE_RESOURCES=0 (the split communicator gets its own
# resources, as before splitShare) for an A/B of that change, and (STANDBY=1,
# the default) both modes with `gotrain launch --standby` (a warmed-up spare
# process per GPU takes over the ranks that need new processes).
# STANDBY_ONLY=1 runs just the two standby variants. WARM_AB=1 adds both
# standby variants with GOTRAIN_STANDBY_WARM_COMM=0 (the standby skips its
# one-rank NCCL warm-up communicator), and NCCL_INFO=1 one more in-process
# standby run with NCCL_DEBUG=INFO, whose "Init timings" lines (NCCL's own
# breakdown of each communicator's init) go into the report. EXTRA runs more
# in-process standby variants with environment settings of their own:
# EXTRA="cumem0:NCCL_CUMEM_ENABLE=0 ch16:NCCL_MAX_NCHANNELS=16,NCCL_X=1"
# (NAME:VAR=VALUE[,VAR=VALUE...] each). torchrun is
# left out (bench/restart.sh runs it). Every step has a timeout; the whole
# script stops starting runs after BUDGET seconds (default 50), so it ends
# within a minute.
#
# Build on the development machine (cgo on; no CUDA needed to build):
#   go build -trimpath -ldflags='-s -w' -o bin/restart/gotrain ./cmd/gotrain
#   go build -trimpath -ldflags='-s -w' -o bin/restart/testprog ./internal/testing/integration/testprog
# then on the GPU machine, from the repository root:
#   BIN=bin/restart bash bench/restart_quick.sh
# Writes RESULTS_DIR/restart-quick-<date>-nccl.md (default bench/results) and
# keeps the raw logs in RESULTS_DIR/restart-quick-raw-<date>/.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin/restart}
GPUS=${GPUS:-2}
# The rank that dies: rank 1, or rank 0 of a one-rank job.
VICTIM=${VICTIM:-$((GPUS > 1 ? 1 : 0))}
BACKEND=${BACKEND:-nccl}
SPLIT_AB=${SPLIT_AB:-1}
STANDBY=${STANDBY:-1}
STANDBY_ONLY=${STANDBY_ONLY:-0}
WARM_AB=${WARM_AB:-0}
NCCL_INFO=${NCCL_INFO:-0}
BUDGET=${BUDGET:-50}
RUN_TIMEOUT=${RUN_TIMEOUT:-20}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
date=$(date -u +%Y-%m-%d)
work="$RESULTS_DIR/restart-quick-raw-$date"
mkdir -p "$RESULTS_DIR" "$work"
: >"$work/timing.txt"
: >"$work/agent.txt"
: >"$work/summary.txt"
t0=$SECONDS

for b in "$BIN/gotrain" "$BIN/testprog"; do
	[[ -x $b ]] || { echo "restart_quick: $b is missing; build it first (see the top of this script)" >&2; exit 2; }
done

# ms NS_DEATH ISO_TIME: milliseconds from the death to an agent log time.
ms() { local t; t=$(date -d "$2" +%s%N 2>/dev/null) || { echo "?"; return; }; echo $(((t - $1) / 1000000)); }

run() { # NAME [env assignments ...] [--launch-flags ...] -- [testprog flags]
	local name=$1
	shift
	local envs=() lflags=()
	while (($#)) && [[ $1 != -- ]]; do
		if [[ $1 == --* ]]; then lflags+=("$1"); else envs+=("$1"); fi
		shift
	done
	shift
	if ((SECONDS - t0 > BUDGET)); then
		echo "$name: skipped (past the ${BUDGET}s budget)" | tee -a "$work/summary.txt" >&2
		return
	fi
	rm -f "$work/mark"
	local start=$SECONDS
	env "${envs[@]}" timeout -k 3 "$RUN_TIMEOUT" "$BIN"/gotrain launch --verbose --nproc-per-node "$GPUS" --backend "$BACKEND" \
		"${lflags[@]}" --max-restarts 1 --grace-period 5s -- "$BIN"/testprog restart --mark "$work/mark" --victim "$VICTIM" "$@" \
		>"$work/$name.out" 2>"$work/$name.err"
	local rc=$?
	local t
	t=$(grep -o 'recovered_in=[0-9.]*' "$work/$name.out" | cut -d= -f2 | sort -g | tail -1)
	echo "$name: exit $rc in $((SECONDS - start)) s; slowest rank back after ${t:-?} s" | tee -a "$work/summary.txt" >&2
	((rc == 0)) || tail -5 "$work/$name.err" >&2
	grep -h TIMING "$work/$name.out" | sed "s/^\[rank [0-9]*\] /$name /" >>"$work/timing.txt"
	# The agent's own steps (--verbose, millisecond times), from the death.
	local death
	death=$(cat "$work/mark" 2>/dev/null)
	if [[ -n $death ]]; then
		grep -E 'msg="(worker exited|generation ended|generation started|worker parked|worker resumed in process|worker started from standby)"' "$work/$name.err" |
			grep -v 'component=coordinator' | while read -r line; do
			local ts msg gen rank
			ts=$(grep -o '^time=[^ ]*' <<<"$line" | cut -d= -f2)
			msg=$(grep -o 'msg="[^"]*"' <<<"$line" | cut -d'"' -f2)
			msg+=$(grep -o ' early=[a-z]*' <<<"$line")
			gen=$(grep -o ' generation=[0-9]*' <<<"$line" | cut -d= -f2)
			rank=$(grep -o ' rank=[0-9]*' <<<"$line" | cut -d= -f2)
			echo "| $name | $(ms "$death" "$ts") | $msg | ${gen:--} | ${rank:--} |"
		done >>"$work/agent.txt"
	fi
}

if ((!STANDBY_ONLY)); then
run process-restart --
run in-process -- --inprocess
fi
if ((STANDBY || STANDBY_ONLY)); then
	run process-restart-standby --standby -- 
	run in-process-standby --standby -- --inprocess
fi
if ((WARM_AB)); then
	run process-restart-standby-nowarm GOTRAIN_STANDBY_WARM_COMM=0 --standby --
	run in-process-standby-nowarm GOTRAIN_STANDBY_WARM_COMM=0 --standby -- --inprocess
fi
if ((NCCL_INFO)); then
	run in-process-standby-ncclinfo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT --standby -- --inprocess
	run in-process-standby-nowarm-ncclinfo GOTRAIN_STANDBY_WARM_COMM=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT --standby -- --inprocess
	run in-process-standby-connectatinit-ncclinfo NCCL_RUNTIME_CONNECT=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT --standby -- --inprocess
fi
for x in ${EXTRA:-}; do
	IFS=, read -ra xenv <<<"${x#*:}"
	run "in-process-standby-${x%%:*}" "${xenv[@]}" --standby -- --inprocess
done
if ((SPLIT_AB && !STANDBY_ONLY)); then
	run process-restart-nosplitshare NCCL_COMM_SPLIT_SHARE_RESOURCES=0 --
	run in-process-nosplitshare NCCL_COMM_SPLIT_SHARE_RESOURCES=0 -- --inprocess
fi

out="$RESULTS_DIR/restart-quick-$date-$BACKEND.md"
{
	echo "# Crash -> first collective of the new generation, one quick run ($date, backend $BACKEND, $GPUS ranks)"
	echo
	echo "machine: $(hostname), $(nproc) CPUs"
	nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
	echo "gotrain: $("$BIN"/gotrain version 2>/dev/null | head -1)"
	echo
	echo "Rank $VICTIM dies (exit 1) 1 s after the first all-reduce (4 MiB float32). recovered_in: death to the"
	echo "slowest rank's first all-reduce of the next generation. *-nosplitshare: NCCL_COMM_SPLIT_SHARE_RESOURCES=0."
	echo "*-standby: gotrain launch --standby (new ranks are warmed-up standby processes: their spawn/main are before the death)."
	echo
	echo '```'
	cat "$work/summary.txt"
	echo '```'
	echo
	echo "## Workers: each step, ms after the death"
	echo
	awk -f bench/restart_timing.awk "$work/timing.txt"
	echo
	if ((NCCL_INFO)); then
		echo "## NCCL's own init breakdown (NCCL_DEBUG=INFO runs; seconds)"
		echo
		echo '```'
		for f in "$work"/*-ncclinfo.out; do
			[[ -e $f ]] || continue
			grep -h "Init timings" "$f" "${f%.out}.err" | sed "s|^|$(basename "$f" .out) |"
		done
		echo '```'
		echo
	fi
	echo "## Agent (gotrain launch --verbose), ms after the death (log times have 1 ms steps)"
	echo
	echo "| run | ms | event | generation | rank |"
	echo "|---|---|---|---|---|"
	cat "$work/agent.txt"
	echo
	echo "Reproduce: BIN=$BIN GPUS=$GPUS bash bench/restart_quick.sh (raw logs: $work)"
} >"$out"
cat "$out"
echo "wrote $out in $((SECONDS - t0)) s" >&2
