#!/usr/bin/env bash
# The first all-reduce of a new 4-rank world of bench/shrinkgrow (threads of
# one process on one GPU, NCCL 2.30.7), launched by each rank's own thread
# (-launch threads, as before 2026-12-02 s3) against one thread and one NCCL
# group (-launch group): RUNS short runs of each, alternating, each a fresh
# process (the hang came before cycle 0, once a process). Prints a count of
# PASS, HANG (exit 3) and other endings per launch mode.
#
#   BIN=bin RUNS=15 OUT_DIR=/tmp/first bash bench/shrinkgrow_first.sh
#
# GOTRAIN_NCCL_LIBRARY must name NCCL ≥ 2.30. DEADLINE (seconds since the
# script started) stops starting runs; LAUNCHES picks the modes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
BIN=${BIN:-bin}
RUNS=${RUNS:-15}
OUT_DIR=${OUT_DIR:-/tmp/shrinkgrow-first}
ARGS=${ARGS:--mode shrink -how abort -ranks 4 -cycles 3 -cycle-timeout 5s}
mkdir -p "$OUT_DIR"
sum=$OUT_DIR/first-summary.txt
: >"$sum"
for i in $(seq "$RUNS"); do
	for l in ${LAUNCHES:-threads group}; do
		if ((SECONDS > ${DEADLINE:-100000})); then
			echo "# deadline: stopped before run $i ($l)" >>"$sum"
			break 2
		fi
		log=$OUT_DIR/first-$l-$i.log
		# shellcheck disable=SC2086 # ARGS is a list of flags
		timeout -k 5 60 "$BIN"/shrinkgrow $ARGS -launch "$l" >"$log" 2>&1
		rc=$?
		echo "$l $i exit=$rc $(grep -m1 -o 'RESULT.*' "$log")" >>"$sum"
	done
done
for l in ${LAUNCHES:-threads group}; do
	awk -v l="$l" '$1 == l { n++; if ($3 == "exit=0") p++; else if ($3 == "exit=3") h++; else o++ }
		END { printf "launch %-7s runs %d  PASS %d  HANG %d  other %d\n", l, n, p, h, o }' "$sum"
done | tee -a "$sum"
