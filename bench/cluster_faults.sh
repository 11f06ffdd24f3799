#!/usr/bin/env bash
# Fault timings on the virtual cluster: runs
# internal/testing/clustertest's fault tests N times and summarises each TIMING line
# they log as min/median/max, with each test's pass count.
#
# CHAOS=1 runs the chaos battery instead, with GOTRAIN_CHAOS set so
# that every case runs: blips of 8 s and 9 s (under the 10 s node timeout;
# both ways and link down; a replica host and a plain node), a 20 s partition
# (over it), the leader cut off from the agents only, two replica hosts lost
# together (and node 1 with one), the leader SIGKILLed, an agent SIGKILLed and
# started again. Its table: per scenario, runs, survived (the test's verdict:
# ridden out, or ended naming the right node where that is the point), and
# the detection and recovery times of its CHAOS lines, min/median/max.
#
# As root (the tests make network namespaces), from anywhere:
#   N=5 bash bench/cluster_faults.sh
#   CHAOS=1 N=10 bash bench/cluster_faults.sh
# Prints the summary (markdown) on stdout; the raw `go test -v` output goes to
# RAW (default /tmp/cluster-faults-raw.txt). TESTS overrides the -run pattern;
# SUMMARY_ONLY=1 summarises an existing RAW without running the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${N:-5}
RAW=${RAW:-/tmp/cluster-faults-raw.txt}
if [ "${CHAOS:-0}" = 1 ]; then
	export GOTRAIN_CHAOS=1
	TESTS=${TESTS:-'TestBlipUnderNodeTimeout|TestPartitionedNode|TestLeaderCutOffFromAgents|TestTwoReplicaHostsLost|TestReplicatedLeaderKilled|TestElasticShrinkAndGrow'}
else
	TESTS=${TESTS:-'TestMNISTFourNodes|TestSIGKILLedAgent|TestPartitionedNode|TestBlip|TestElasticShrinkAndGrow'}
fi
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}

if [ "${SUMMARY_ONLY:-0}" = 1 ]; then
	rc=0 secs=0
elif [ "$(id -u)" != 0 ]; then
	echo "cluster_faults.sh: run as root: the tests make network namespaces" >&2
	exit 2
else
	start=$(date +%s)
	go test -count="$N" -timeout 180m -run "$TESTS" -v ./internal/testing/clustertest/ >"$RAW" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
fi

echo "go test -count=$N -run '$TESTS' -v ./internal/testing/clustertest/ : exit $rc, ${secs} s (raw output: $RAW)"
echo
python3 - "$RAW" <<'EOF'
import re, statistics, sys

raw = open(sys.argv[1], errors="replace").read()

# A Go duration (1m2.5s, 850ms, 2.1s, 15µs) in seconds.
def dur(s):
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    return sum(float(v) * unit[u] for v, u in re.findall(r"([0-9.]+)(h|ms|m|s|us|µs|ns)", s))

D = r"((?:[0-9.]+(?:h|ms|m|s|us|µs|ns))+)"
kinds = [
    ("4-node rendezvous, last agent's start -> all running", rf"TIMING 4-node rendezvous: {D} from the last agent's start"),
    ("4-node rendezvous, last join -> all running", rf"TIMING 4-node rendezvous: .* \({D} from the last node's join\)"),
    ("SIGKILL -> coordinator notices", rf"TIMING SIGKILL detection: the coordinator noticed {D} after"),
    ("SIGKILL -> last survivor exited", rf"TIMING SIGKILL detection: .*the last survivor exited {D} after"),
    ("partition -> coordinator declares the node lost", rf"TIMING partition detection: the coordinator declared a node lost {D} after"),
    ("partition -> last survivor exited", rf"TIMING partition detection: .*the last survivor exited {D} after"),
    ("partition -> the cut-off node's agent exited", rf"TIMING the cut-off node's agent exited -?\d+, {D} after the cut"),
    ("elastic: SIGKILL -> 3-node generation started (node1)", rf"TIMING elastic recovery: node1 started the 3-node generation {D} after"),
    ("elastic: agent restarted -> 4-node generation started (node1)", rf"TIMING elastic recovery: .*the 4-node one {D} after"),
]
print("| measurement | n | min (s) | median (s) | max (s) | all (s) |")
print("|---|---|---|---|---|---|")
for name, rx in kinds:
    v = [dur(m) for m in re.findall(rx, raw)]
    if not v:
        print(f"| {name} | 0 | | | | |")
        continue
    print(f"| {name} | {len(v)} | {min(v):.3f} | {statistics.median(v):.3f} | {max(v):.3f} | {' '.join(f'{x:.3f}' for x in v)} |")
print()
print("| test | pass | fail | runs (s) |")
print("|---|---|---|---|")
tests = sorted(set(re.findall(r"--- (?:PASS|FAIL|SKIP): (Test\w+)", raw)))
for t in tests:
    p = re.findall(rf"--- PASS: {t} \(([0-9.]+)s\)", raw)
    f = re.findall(rf"--- FAIL: {t} \(([0-9.]+)s\)", raw)
    s = re.findall(rf"--- SKIP: {t} ", raw)
    print(f"| {t} | {len(p)} | {len(f)}{' (+%d skipped)' % len(s) if s else ''} | {' '.join(p + [x + '(F)' for x in f])} |")
# The chaos battery: one row per scenario (a test, or a subtest), from its
# verdicts and CHAOS lines.
chaos = re.findall(r"CHAOS scenario=(\S+) detect=(\S+) recover=(\S+)", raw)
verdicts = re.findall(r"--- (PASS|FAIL): (Test\S+) \(", raw)
scen = sorted({n for _, n in verdicts if "/" in n or not any(v.startswith(n + "/") for _, v in verdicts)} | {c[0] for c in chaos})
if chaos:
    def mmm(v):
        return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}" if v else "-"
    print()
    print("| scenario | runs | survived | detection min / median / max (s) | recovery min / median / max (s) |")
    print("|---|---|---|---|---|")
    for n in scen:
        runs = [v for v, m in verdicts if m == n]
        det = [dur(d) for c, d, _ in chaos if c == n and d != "-"]
        rec = [dur(r) for c, _, r in chaos if c == n and r != "-"]
        print(f"| {n} | {len(runs)} | {runs.count('PASS')} | {mmm(det)} | {mmm(rec)} |")
never = raw.count("never found node3 unreachable")
blips = len(re.findall(r"--- (?:PASS|FAIL): TestBlip \(", raw))
if blips:
    print()
    print(f"TestBlip: the coordinator logged node3 unreachable during the 2 s blip in {blips - never} of {blips} runs (and rode it out when the test passed).")
EOF
exit $rc
