#!/usr/bin/env bash
# bench/coordinator_failover.sh [N]: how long a replicated coordinator's
# failover takes on the virtual cluster, and what its Raft
# timeouts cost while idle. Needs root (network namespaces), iproute2,
# iptables; run from anywhere in the repository.
#
# 1. N runs (default 10) of internal/testing/clustertest's TestReplicatedLeaderKilled
#    (3 standalone replicas on hosts 1-3, 2 agents training MNIST on hosts
#    4-5; the leader replica SIGKILLed once the ranks run), one at a time,
#    with GOTRAIN_BENCH_FAILOVER=1: each run ends once the failover is
#    measured. Measured from the SIGKILL (the test's clock, just before the
#    signal) to
#      elected: the new leader's "coordinator replica leads" log line;
#      served:  its last "watch stream resumed" line, i.e. every agent's
#               watch stream reopened at the new leader (the agents' own
#               "leader is now at" lines carry no time).
#    Then the same with the leader's host partitioned both ways
#    (TestReplicatedLeaderPartitioned), unless PARTITION=0.
#    "leaderships" counts "coordinator replica leads" lines per run: 2 is
#    the first leader and its successor; more is a needless leader change.
# 2. Idle cost: a replica set of 3 (`gotrain coordinator --peers`, waiting
#    for agents that never come) and, for comparison, one unreplicated
#    coordinator, side by side in a network namespace of their own on
#    loopback; CPU time (utime+stime from /proc/PID/stat) over IDLE_SECONDS
#    (default 60) after a 5 s warm-up, and the leaderships taken meanwhile.
#
# Environment: PARTITION=0 skips the partition runs; IDLE_SECONDS=0 skips
# the idle measurement.
set -euo pipefail

N=${1:-10}
PARTITION=${PARTITION:-1}
IDLE_SECONDS=${IDLE_SECONDS:-60}
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
out=$(mktemp -d /tmp/coordinator-failover.XXXXXX)
echo "# logs in $out"
echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# summary FILE LABEL REGEX: min/median/max of the durations REGEX matches
# (its first number, up to " after"), Go's time.Duration.String() ("979ms",
# "1.585s", "1m2.5s") read as seconds.
summary() {
	awk -v label="$2" -v re="$3" '
	function secs(d,   m, s) {
		m = 0
		if (d ~ /ms$/) { sub(/ms$/, "", d); return d / 1000 }
		if (d ~ /µs$/) { sub(/µs$/, "", d); return d / 1e6 }
		if (d ~ /m/) { split(d, p, "m"); m = p[1] * 60; d = p[2] }
		sub(/s$/, "", d); return m + d
	}
	{ if (match($0, re)) { s = substr($0, RSTART, RLENGTH); sub(/^[^0-9]*/, "", s); sub(/ after.*$/, "", s); v[n++] = secs(s) } }
	END {
		if (n == 0) { printf "%-40s no runs\n", label; exit }
		for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
		med = (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
		printf "%-40s n=%d min %.3f s  median %.3f s  max %.3f s  all:", label, n, v[0], med, v[n - 1]
		for (i = 0; i < n; i++) printf " %.3f", v[i]
		printf "\n"
	}' "$1"
}

failover() { # failover TEST WHAT
	local log="$out/$1.log"
	echo "# $N runs of $1 (GOTRAIN_BENCH_FAILOVER=1, one at a time)"
	GOTRAIN_BENCH_FAILOVER=1 go test ./internal/testing/clustertest -run "^$1\$" -count="$N" -parallel 1 -v -timeout 60m >"$log" 2>&1 || true
	echo "# passes: $(grep -c -- "^--- PASS: $1" "$log" || true)/$N"
	summary "$log" "$2: new leader elected" '\) [0-9.µms]+ after the (kill|cut)'
	summary "$log" "$2: every agent served by it" 'resumed there [0-9.µms]+ after'
	echo "$2: leaderships per run: $(grep -o 'TIMING leader changes: [0-9]*' "$log" | awk '{print $NF}' | sort | uniq -c | awk '{printf "%s run(s) with %s; ", $1, $2}')"
}

[ "$N" -gt 0 ] && failover TestReplicatedLeaderKilled "leader SIGKILL"
if [ "$N" -gt 0 ] && [ "$PARTITION" != 0 ]; then
	failover TestReplicatedLeaderPartitioned "leader partitioned"
fi

[ "$IDLE_SECONDS" = 0 ] && exit 0

# Idle cost, in a namespace of our own (loopback only).
bin=$out/gotrain
go build -o "$bin" ./cmd/gotrain
ns=gtfailover$$
ip netns add "$ns"
pids=()
cleanup() {
	exec 2>/dev/null # not the shell's "Killed" for each
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do while [ -e "/proc/$p" ] && ! grep -q '^[^)]*) Z' "/proc/$p/stat" 2>/dev/null; do sleep 0.05; done; done
	ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
ip -n "$ns" link set lo up
export GOTRAIN_JOB_TOKEN
GOTRAIN_JOB_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
peers=127.0.0.1:29600,127.0.0.2:29600,127.0.0.3:29600
for i in 1 2 3; do
	ip netns exec "$ns" "$bin" coordinator --peers "$peers" --listen "127.0.0.$i:29600" --nnodes 2 --rendezvous-timeout 1h \
		>/dev/null 2>"$out/idle-replica$i.log" &
	pids+=($!)
done
ip netns exec "$ns" "$bin" coordinator --listen 127.0.0.9:29700 --nnodes 2 --rendezvous-timeout 1h >/dev/null 2>"$out/idle-single.log" &
pids+=($!)
sleep 5
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; } # utime + stime, after the comm field
declare -a before
for i in 0 1 2 3; do before[$i]=$(ticks "${pids[$i]}"); done
leads_before=$(cat "$out"/idle-replica*.log | grep -c 'msg="coordinator replica leads"' || true)
sleep "$IDLE_SECONDS"
hz=$(getconf CLK_TCK)
total=0
for i in 0 1 2; do
	d=$(($(ticks "${pids[$i]}") - ${before[$i]}))
	total=$((total + d))
	echo "idle replica $((i + 1)): $(awk -v d="$d" -v hz="$hz" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.2f s CPU in %d s (%.2f%% of one core)", d / hz, s, 100 * d / hz / s }')$(grep -q 'msg="coordinator replica leads"' "$out/idle-replica$((i + 1)).log" && echo ' (the leader)')"
done
echo "idle replica set (3): $(awk -v d="$total" -v hz="$hz" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.2f s CPU in %d s (%.2f%% of one core)", d / hz, s, 100 * d / hz / s }')"
d=$(($(ticks "${pids[3]}") - ${before[3]}))
echo "idle unreplicated coordinator: $(awk -v d="$d" -v hz="$hz" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.2f s CPU in %d s (%.2f%% of one core)", d / hz, s, 100 * d / hz / s }')"
leads_after=$(cat "$out"/idle-replica*.log | grep -c 'msg="coordinator replica leads"' || true)
echo "idle replica set: $leads_before leadership(s) taken before the window, $((leads_after - leads_before)) during it (0: no needless leader change)"
