#!/usr/bin/env bash
# Straggler mitigation on CPU
# ranks: throughput before a rank turns slow, while it is slow, and after
# gotrain replaced it. Each run is one `gotrain launch` of testprog's
# training loop (RANKS ranks, 200ms compute + up to 50ms jitter per step,
# one all-reduce per step) in which rank SLOWRANK computes 600ms per step
# from step SLOWFROM on, in generation 0 only (testprog --slow-generation 0:
# its first incarnation is slow, as a process on a bad core or with a
# leaking cache would be; a new process is not). With --on-straggler
# replace and --straggler-persist PERSIST, gotrain ends generation 0 once
# the verdict has stood that long and starts every rank afresh; generation
# 1 runs STEPS steps at full speed and the job exits 0.
#
# From rank 0's STEP lines (its own clock; every rank runs at the slowest
# one's pace) it reports, per run, steps/s before the slowdown (steps 5 to
# SLOWFROM-1 of generation 0), during it (SLOWFROM+1 to generation 0's
# last step), and after the replacement (generation 1, from step 5 on); the
# seconds from the slowdown to the verdict and to the replacement (the
# agent's lines, stamped when read), and the gap from generation 0's last
# step to generation 1's first (what a replacement costs here: stop, start,
# rendezvous). The job runs with --max-restarts 0: a replacement is not a
# restart.
#
#   bash bench/straggler_replace.sh                 # from the repository root
#   RUNS=5 PERSIST=10s bash bench/straggler_replace.sh
#   RESULT=bench/results/x.md bash bench/straggler_replace.sh   # append the table
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH=$PATH:/usr/local/go/bin
RUNS=${RUNS:-5}
RANKS=${RANKS:-3}
SLOWRANK=${SLOWRANK:-2}
SLOWFROM=${SLOWFROM:-40}
STEPS=${STEPS:-120}
PERSIST=${PERSIST:-10s}
RESULT=${RESULT:-/dev/stdout}
work=$(mktemp -d)
lpid='' mpid=''
cleanup() {
	[[ -n $lpid ]] && kill -INT "$lpid" 2>/dev/null
	[[ -n $mpid ]] && kill "$mpid" 2>/dev/null
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

go build -o "$work/gotrain" ./cmd/gotrain && go build -o "$work/testprog" ./internal/testing/integration/testprog || exit 1
mkdir -p "$work/run"
if [[ $RESULT == /dev/stdout ]]; then exec 3>&1; else exec 3>>"$RESULT"; fi
echo "bench: RUNS=$RUNS RANKS=$RANKS SLOWRANK=$SLOWRANK SLOWFROM=$SLOWFROM STEPS=$STEPS PERSIST=$PERSIST, $(nproc) CPUs, load $(cat /proc/loadavg)"
printf '| run | steps/s before | steps/s slow | steps/s after | after/slow | slow -> verdict s | verdict -> replaced s | gap s | exit |\n' >&3
printf '|---|---|---|---|---|---|---|---|---|\n' >&3
for ((i = 1; i <= RUNS; i++)); do
	out=$work/run-$i.txt
	mkfifo "$work/pipe-$i"
	# Every output line gets the time it was read (unix ms).
	while IFS= read -r l; do printf '%s %s\n' "$(date +%s%3N)" "$l"; done <"$work/pipe-$i" >"$out" &
	mpid=$!
	XDG_RUNTIME_DIR=$work/run "$work/gotrain" launch --nproc-per-node "$RANKS" --backend cpu --max-restarts 0 --grace-period 1s \
		--on-straggler replace --straggler-persist "$PERSIST" -- \
		"$work/testprog" hang --fault none --steps "$STEPS" --step-time 200ms --jitter 50ms \
		--slow-rank "$SLOWRANK" --slow-from "$SLOWFROM" --slow-step-time 600ms --slow-generation 0 --step-lines >"$work/pipe-$i" 2>&1 &
	lpid=$!
	wait "$lpid"
	code=$?
	wait "$mpid"
	lpid='' mpid=''
	awk -v run="$i" -v from="$SLOWFROM" -v code="$code" '
	/STEP rank 0 gen/ { for (k = 1; k <= NF; k++) { if ($k == "gen") g = $(k+1); if ($k == "seq") s = $(k+1); if ($k == "unix_ms") t = $(k+1) }
		T[g, s] = t; if (s > last[g]) last[g] = s; next }
	/SLOW rank/ && !slow { for (k = 1; k <= NF; k++) if ($k == "unix_ms") slow = $(k+1); next }
	/gotrain: straggler \(straggler, generation 0\)/ && !named { named = $1; next }
	/gotrain: generation 0 ended: replacing/ && !replaced { replaced = $1; next }
	function r(g, a, b) { return ((g, a) in T && (g, b) in T && T[g, b] > T[g, a]) ? (b - a) / ((T[g, b] - T[g, a]) / 1000) : 0 }
	END {
		before = r(0, 5, from - 1); during = r(0, from + 1, last[0]); after = r(1, 5, last[1])
		gap = ((0, last[0]) in T && (1, 1) in T) ? (T[1, 1] - T[0, last[0]]) / 1000 : -1
		printf "| %d | %.2f | %.2f | %.2f | %.2fx | %.1f | %.1f | %.1f | %d |\n", run, before, during, after, during ? after / during : 0,
			(named && slow) ? (named - slow) / 1000 : -1, (replaced && named) ? (replaced - named) / 1000 : -1, gap, code
	}' "$out" >&3
	grep -q "gotrain: generation 0 ended: replacing" "$out" || echo "bench: run $i: no replacement (raw output: $out)"
done
echo "bench: done, load $(cat /proc/loadavg); raw output: $work"
