#!/usr/bin/env bash
# Straggler detection latency and precision (issue 28) on CPU ranks: one
# `gotrain launch` of testprog's training loop (200ms compute + up to 50ms
# jitter per step, one all-reduce per step) in which, every PERIOD steps, the
# next rank in turn computes 600ms per step for SLOWFOR steps (an injection).
# For each injection it records the steps and seconds from the slowdown to
# the agent's "gotrain: straggler" line, and counts verdicts that name a rank
# that was not slow (false) and injections never named (missed). Also checks
# that no hang verdict comes (adaptive timeout, no --hang-timeout).
#
#   bash bench/stragglers.sh            # from the repository root
#   INJECTIONS=20 RANKS=4 bash bench/stragglers.sh
#   OUT=/tmp/.../out.txt bash bench/stragglers.sh   # score a raw output again
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
INJECTIONS=${INJECTIONS:-8}
RANKS=${RANKS:-3}
PERIOD=${PERIOD:-50}
SLOWFOR=${SLOWFOR:-20}
RESULT=${RESULT:-/dev/stdout}
work=$(mktemp -d)
if [[ -n ${OUT:-} ]]; then # score an earlier run's raw output
	cp "$OUT" "$work/out.txt"
else
go build -o "$work/gotrain" ./cmd/gotrain && go build -o "$work/testprog" ./internal/integration/testprog || exit 1
steps=$((PERIOD * (INJECTIONS + 1) - 1)) # the last period ends with the last step
# Every output line gets the time it was read (unix ms), for the latency.
XDG_RUNTIME_DIR=$work "$work/gotrain" launch --nproc-per-node "$RANKS" --backend cpu --max-restarts 0 --grace-period 1s -- \
	"$work/testprog" hang --fault none --steps "$steps" --step-time 200ms --jitter 50ms \
	--slow-every "$PERIOD" --slow-for "$SLOWFOR" --slow-step-time 600ms 2>&1 |
	while IFS= read -r l; do printf '%s %s\n' "$(date +%s%3N)" "$l"; done >"$work/out.txt"
fi
# Latency in seconds: from the slow rank's own clock at its first slow step
# (its SLOW line) to the moment the agent's straggler line was read; in
# steps: seconds over the slowed job's step time (600ms + 25ms mean jitter,
# every rank runs at the slow one's pace). A verdict naming a rank that is not
# the current injection's is false; an injection with no verdict is missed.
awk -v steptime=0.625 '
/SLOW rank/ { for (i=1;i<=NF;i++) { if ($i=="rank") r=$(i+1); if ($i=="unix_ms") t=$(i+1) }
	n++; rank[n]=r; at[n]=t; named[n]=0; next }
/gotrain: straggler/ { match($0, /rank [0-9]+ on host/); rr=substr($0, RSTART+5, RLENGTH-13)+0
	if (n>0 && rr==rank[n] && !named[n]) { named[n]=1; lat[n]=($1-at[n])/1000; tp++; printf "injection %d: rank %d named after %.2fs (~%.1f steps): %s\n", n, rr, lat[n], lat[n]/steptime, substr($0, index($0,"rank")) }
	else { fp++; printf "FALSE: %s\n", $0 }
	next }
/hang detected/ { hangs++; print "HANG: " $0 }
END {
	m=0; for (i=1;i<=n;i++) if (named[i]) { v[++m]=lat[i] }
	for (i=2;i<=m;i++) { x=v[i]; for (j=i-1;j>=1 && v[j]>x;j--) v[j+1]=v[j]; v[j+1]=x }
	med = m ? v[int((m+1)/2)] : 0; mx = m ? v[m] : 0
	printf "\ninjections %d, named %d (recall %.2f), false verdicts %d (precision %.2f), hang verdicts %d\n", n, tp, n?tp/n:0, fp, (tp+fp)?tp/(tp+fp):0, hangs
	printf "latency median %.2fs (~%.1f steps), max %.2fs (~%.1f steps)\n", med, med/steptime, mx, mx/steptime
}' "$work/out.txt"
echo "raw output: $work/out.txt"
