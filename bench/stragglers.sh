#!/usr/bin/env bash
# Straggler detection latency, precision and recall on CPU ranks:
# one `gotrain launch` of testprog's training loop (200ms compute + up to 50ms
# jitter per step, one all-reduce per step) in which, over and over, one rank
# in turn (1, 2, 0, 1, ...) is made slow for a while (an injection). INJECT
# picks how:
#
#   step     (default) the program itself: every PERIOD steps the next rank
#            computes 600ms per step for SLOWFOR steps (testprog --slow-every),
#            and prints SLOW/FAST lines with its own clock.
#   sigstop  the bench: the program runs clean, and the bench stops the rank's
#            process with SIGSTOP for STOP_MS of every BURST_MS (SIGCONT for
#            the rest) during SLOWSECS, then leaves it alone for GAPSECS.
#   cgroup   the bench: it moves the rank's process into a child cgroup whose
#            CPU bandwidth is CPU_MAX ("QUOTA PERIOD" in microseconds, as
#            cgroup v2's cpu.max) for SLOWSECS, then moves it back. cgroup v2
#            cpu.max when the v2 hierarchy offers the cpu controller, else the
#            v1 cpu controller's cpu.cfs_quota_us/cpu.cfs_period_us (the same
#            CFS bandwidth control); CGROUP=v2 or v1 insists on one. Skipped,
#            with a message, where neither is writable.
#
# sigstop and cgroup find the rank's process by /proc/PID/cmdline (this run's
# testprog binary) and RANK=R in /proc/PID/environ (standbys excluded), wait
# until the job has done PERIOD steps (the step kind's first injection), and
# record the wall time each injection starts and ends.
#
# For each injection it records the seconds from its start to the moment the
# agent's "gotrain: straggler" line was read, and that in steps of the slowed
# job (step counts from `gotrain top --once --json`, sampled every second). A
# verdict is true when the rank it names is being slowed, or was until at
# most GRACE seconds before (the detector judges a 5 s window behind ~3 s of
# report delay); else it is false. An injection named at least once counts
# for recall; a verdict naming an injection already named is a repeat (true,
# counted apart). Also counts hang verdicts (adaptive timeout, no
# --hang-timeout): there should be none.
#
#   bash bench/stragglers.sh            # from the repository root
#   INJECTIONS=20 RANKS=4 bash bench/stragglers.sh
#   INJECT=sigstop INJECTIONS=40 bash bench/stragglers.sh
#   INJECT=cgroup CPU_MAX="2000 100000" INJECTIONS=40 bash bench/stragglers.sh
#   OUT=/tmp/.../out.txt bash bench/stragglers.sh   # score a raw output again
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH=$PATH:/usr/local/go/bin
INJECT=${INJECT:-step}
INJECTIONS=${INJECTIONS:-8}
RANKS=${RANKS:-3}
PERIOD=${PERIOD:-50}
SLOWFOR=${SLOWFOR:-20}
SLOWSECS=${SLOWSECS:-12.5} # sigstop/cgroup: ~ the step kind's 20 steps of ~0.625 s
GAPSECS=${GAPSECS:-7}      # sigstop/cgroup: ~ the step kind's 30 clean steps
STOP_MS=${STOP_MS:-400}
BURST_MS=${BURST_MS:-600}
CPU_MAX=${CPU_MAX:-1500 100000} # a rank needs ~1-3 % of a core: "20000 100000" does not slow it
CGROUP=${CGROUP:-auto}
GRACE=${GRACE:-8}
RESULT=${RESULT:-/dev/stdout} # the scores are appended to it
case $INJECT in step | sigstop | cgroup) ;; *)
	echo "stragglers.sh: INJECT=$INJECT: want step, sigstop or cgroup" >&2
	exit 2
	;;
esac
work=$(mktemp -d)
inj=$work/inject.txt # the bench's own lines: injections, step samples, load
: >"$inj"

now_ms() { local t=${EPOCHREALTIME//[!0-9]/}; NOW=$((t / 1000)); }
sleep_until() { # $1: unix ms
	local r
	now_ms
	r=$(($1 - NOW))
	((r > 0)) || return 0
	printf -v r '%d.%03d' $((r / 1000)) $((r % 1000))
	sleep "$r"
}
secs_ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 }'; }

# rank_pid R prints the pid of this run's testprog process of rank R.
rank_pid() {
	local p a e kv rank standby
	for p in /proc/[0-9]*; do
		mapfile -d '' -t a <"$p/cmdline" 2>/dev/null || continue
		[[ ${a[0]:-} == "$work/testprog" && ${a[1]:-} == hang ]] || continue
		mapfile -d '' -t e <"$p/environ" 2>/dev/null || continue
		rank='' standby=''
		for kv in "${e[@]}"; do
			case $kv in RANK=*) rank=${kv#RANK=} ;; GOTRAIN_STANDBY=1) standby=1 ;; esac
		done
		if [[ $rank == "$1" && -z $standby ]]; then
			echo "${p#/proc/}"
			return 0
		fi
	done
	return 1
}

# The cgroup the slow rank is moved into: cg (its directory), cgver, and
# cgroot (the hierarchy's mount point, to move the process back).
cg='' cgver='' cgroot='' cgname=gotrain-stragglers-$$
cg_setup() {
	local v2='' v1 quota period
	read -r quota period <<<"$CPU_MAX"
	period=${period:-100000}
	if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
		v2=/sys/fs/cgroup
	elif [[ -f /sys/fs/cgroup/unified/cgroup.controllers ]]; then
		v2=/sys/fs/cgroup/unified
	fi
	if [[ $CGROUP != v1 && -n $v2 ]]; then
		if ! grep -qw cpu "$v2/cgroup.controllers"; then
			echo "bench: cgroup v2 at $v2 has no cpu controller (controllers: $(cat "$v2/cgroup.controllers")): no cpu.max"
		elif { grep -qw cpu "$v2/cgroup.subtree_control" || echo +cpu >"$v2/cgroup.subtree_control"; } 2>/dev/null &&
			mkdir "$v2/$cgname" 2>/dev/null && echo "$quota $period" >"$v2/$cgname/cpu.max" 2>/dev/null; then
			cg=$v2/$cgname cgver=v2 cgroot=$v2
			return 0
		else
			echo "bench: cgroup v2 at $v2: cannot enable cpu or write cpu.max in a child"
			rmdir "$v2/$cgname" 2>/dev/null
		fi
	fi
	[[ $CGROUP == v2 ]] && return 1
	v1=$(awk '$3 == "cgroup" && ("," $4 ",") ~ /,cpu,/ { print $2; exit }' /proc/mounts)
	if [[ -n $v1 ]] && mkdir "$v1/$cgname" 2>/dev/null; then
		[[ $quota == max ]] && quota=-1
		if echo "$period" >"$v1/$cgname/cpu.cfs_period_us" && echo "$quota" >"$v1/$cgname/cpu.cfs_quota_us"; then
			cg=$v1/$cgname cgver=v1 cgroot=$v1
			return 0
		fi
		rmdir "$v1/$cgname" 2>/dev/null
	fi
	echo "bench: no writable cgroup v1 cpu controller either (mount: ${v1:-none})"
	return 1
}
# cg_home PID prints the directory of PID's own cgroup in the hierarchy used.
cg_home() {
	local line path=
	while IFS= read -r line; do
		if [[ $cgver == v2 && $line == 0::* ]]; then
			path=${line#0::}
		elif [[ $cgver == v1 && $line =~ ^[0-9]+:([^:]*,)?cpu(,[^:]*)?:(.*)$ ]]; then
			path=${BASH_REMATCH[3]}
		fi
	done <"/proc/$1/cgroup"
	echo "$cgroot${path%/}"
}
cg_throttled() { awk '$1 == "nr_throttled" { n = $2 } $1 == "throttled_usec" { t = $2 / 1e6 } $1 == "throttled_time" { t = $2 / 1e9 } END { printf "nr_throttled %d throttled_s %.2f", n, t }' "$cg/cpu.stat"; }

stopped='' moved='' home='' lpid='' spid='' mpid=''
cleanup() {
	[[ -n $stopped ]] && kill -CONT "$stopped" 2>/dev/null
	[[ -n $moved ]] && echo "$moved" >"$home/cgroup.procs" 2>/dev/null
	stopped='' moved=''
	[[ -n $cg ]] && rmdir "$cg" 2>/dev/null
	[[ -n $mpid ]] && kill "$mpid" 2>/dev/null
	[[ -n $lpid ]] && kill -INT "$lpid" 2>/dev/null
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# sample prints, every second while the launcher runs, the job's step (the
# lowest any rank reported) and the load average.
sample() {
	local s l
	while kill -0 "$lpid" 2>/dev/null; do
		s=$(XDG_RUNTIME_DIR=$work/run "$work/gotrain" top --once --json 2>/dev/null |
			awk '/"step":/ { v = $2 + 0; if (m == "" || v < m) m = v } END { print m }')
		read -r l _ </proc/loadavg
		now_ms
		[[ -n $s ]] && echo "$NOW STEP $s LOAD $l" >>"$inj"
		sleep 1
	done
}
job_step() { awk '$2 == "STEP" { s = $3 } END { print s + 0 }' "$inj"; }

# inject runs the sigstop or cgroup injections.
inject() {
	local i r pid start end c slow_ms gap_ms
	slow_ms=$(secs_ms "$SLOWSECS") gap_ms=$(secs_ms "$GAPSECS")
	until (($(job_step) >= PERIOD)); do
		kill -0 "$lpid" 2>/dev/null || return 1
		sleep 0.5
	done
	for ((i = 1; i <= INJECTIONS; i++)); do
		r=$((i % RANKS))
		if ! pid=$(rank_pid "$r"); then
			echo "bench: rank $r's process not found: injections stop at $((i - 1))"
			return 1
		fi
		[[ $INJECT == cgroup ]] && home=$(cg_home "$pid")
		now_ms
		start=$NOW end=$((NOW + slow_ms))
		echo "$NOW INJECT SLOW rank $r pid $pid kind $INJECT unix_ms $NOW" >>"$inj"
		case $INJECT in
		sigstop)
			for ((c = start; c < end; c += BURST_MS)); do
				stopped=$pid
				kill -STOP "$pid" || break
				sleep_until $((c + STOP_MS < end ? c + STOP_MS : end))
				kill -CONT "$pid"
				stopped=''
				sleep_until $((c + BURST_MS < end ? c + BURST_MS : end))
			done
			now_ms
			echo "$NOW INJECT FAST rank $r unix_ms $NOW" >>"$inj"
			;;
		cgroup)
			moved=$pid
			echo "$pid" >"$cg/cgroup.procs"
			sleep_until "$end"
			echo "$pid" >"$home/cgroup.procs"
			moved=''
			now_ms
			echo "$NOW INJECT FAST rank $r unix_ms $NOW $(cg_throttled)" >>"$inj"
			;;
		esac
		sleep_until $((end + gap_ms))
		kill -0 "$lpid" 2>/dev/null || {
			echo "bench: the job ended during injection $i"
			return 1
		}
	done
}

if [[ -n ${OUT:-} ]]; then # score an earlier run's raw output
	cp "$OUT" "$work/out.txt"
else
	if [[ $INJECT == cgroup ]] && ! cg_setup; then
		echo "SKIPPED: INJECT=cgroup needs a writable cgroup with CPU bandwidth control (v2 cpu.max or v1 cpu.cfs_quota_us)"
		exit 0
	fi
	[[ $INJECT == cgroup ]] && echo "bench: cgroup $cgver $cg, CPU_MAX $CPU_MAX (quota period, us)"
	go build -o "$work/gotrain" ./cmd/gotrain && go build -o "$work/testprog" ./internal/testing/integration/testprog || exit 1
	mkdir -p "$work/run"
	if [[ $INJECT == step ]]; then
		steps=$((PERIOD * (INJECTIONS + 1) - 1)) # the last period ends with the last step
		prog=("$work/testprog" hang --fault none --steps "$steps" --step-time 200ms --jitter 50ms
			--slow-every "$PERIOD" --slow-for "$SLOWFOR" --slow-step-time 600ms)
	else # no fault in the program: the bench injects, and ends the job
		prog=("$work/testprog" hang --fault none --steps 1000000 --step-time 200ms --jitter 50ms)
	fi
	echo "bench: INJECT=$INJECT INJECTIONS=$INJECTIONS RANKS=$RANKS load $(cat /proc/loadavg)"
	# Every output line gets the time it was read (unix ms), for the latency.
	mkfifo "$work/pipe"
	while IFS= read -r l; do printf '%s %s\n' "$(date +%s%3N)" "$l"; done <"$work/pipe" >"$work/launch.txt" &
	mpid=$!
	XDG_RUNTIME_DIR=$work/run "$work/gotrain" launch --nproc-per-node "$RANKS" --backend cpu --max-restarts 0 --grace-period 1s -- \
		"${prog[@]}" >"$work/pipe" 2>&1 &
	lpid=$!
	sample &
	spid=$!
	if [[ $INJECT != step ]]; then
		inject
		kill -INT "$lpid" 2>/dev/null
	fi
	wait "$lpid"
	wait "$spid" "$mpid"
	lpid='' mpid=''
	echo "bench: done, load $(cat /proc/loadavg)"
	sort -s -n -k1,1 "$work/launch.txt" "$inj" >"$work/out.txt"
fi
# The scores go to stdout, or are appended to RESULT.
if [[ $RESULT == /dev/stdout ]]; then exec 3>&1; else exec 3>>"$RESULT"; fi
# Injection start: the slow rank's own clock at its first slow step (its SLOW
# line) for INJECT=step, the bench's clock when it began for sigstop/cgroup.
# Latency: from then to the moment the agent's straggler line was read; in
# steps: that over the slowed job's step time, measured from the sampled step
# counts inside the slow windows (every rank runs at the slow one's pace).
awk -v grace="$GRACE" '
function stepat(t,  i) {
	if (ns == 0) return -1
	if (t <= sT[1]) return sS[1]
	for (i = 2; i <= ns; i++) if (sT[i] >= t) return sS[i-1] + (sS[i] - sS[i-1]) * (t - sT[i-1]) / (sT[i] - sT[i-1])
	return sS[ns]
}
function pct(a, m, p,  k) { k = int(p * m + 0.999999); if (k < 1) k = 1; return a[k] }
function sortv(a, m,  i, j, x) { for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j+1] = a[j]; a[j+1] = x } }
$2 == "STEP" { ns++; sT[ns] = $1; sS[ns] = $3; load += $5; nl++; next }
/SLOW rank/ { for (i = 1; i <= NF; i++) { if ($i == "rank") r = $(i+1); if ($i == "unix_ms") t = $(i+1) }
	n++; rank[n] = r; at[n] = t; until[n] = 0; named[n] = 0; cur[r] = n; next }
/FAST rank/ { for (i = 1; i <= NF; i++) { if ($i == "rank") r = $(i+1); if ($i == "unix_ms") t = $(i+1) }
	if (r in cur) until[cur[r]] = t
	if (/throttled/) { # cpu.stat counts since the cgroup was made: the share of this window
		for (i = 1; i <= NF; i++) { if ($i == "nr_throttled") a = $(i+1); if ($i == "throttled_s") b = $(i+1) }
		thr[cur[r]] = sprintf("throttled %d times, %.1fs", a - thra, b - thrb); thra = a; thrb = b }
	next }
/gotrain: straggler/ { match($0, /rank [0-9]+ on host/); rr = substr($0, RSTART+5, RLENGTH-13) + 0
	j = (rr in cur) ? cur[rr] : 0
	if (j && $1 >= at[j] && (!until[j] || $1 <= until[j] + 1000*grace)) {
		if (!named[j]) { named[j] = 1; vt[j] = $1; lat[j] = ($1 - at[j]) / 1000; tp++ }
		else { rep++; printf "REPEAT (injection %d): %s\n", j, $0 }
	} else { fp++; printf "FALSE: %s\n", $0 }
	next }
/gotrain: hang detected/ || (/hang detected/ && !/verdict=straggler/) { hangs++; print "HANG: " $0 }
END {
	# The slowed and clean step times: steps between samples 3 s into a slow
	# window (or a gap) and its end, past the report lag.
	for (i = 1; i <= n; i++) {
		if (ns && until[i] > at[i] + 4000 && (d = stepat(until[i]) - stepat(at[i] + 3000)) > 0) slow[++nsl] = sl[i] = (until[i] - at[i] - 3000) / 1000 / d
		e = (i < n) ? at[i+1] : (ns ? sT[ns] : 0)
		if (ns && until[i] && e > until[i] + 4000 && (d = stepat(e) - stepat(until[i] + 3000)) > 0) fast[++nfa] = (e - until[i] - 3000) / 1000 / d
	}
	sortv(slow, nsl); sortv(fast, nfa)
	sst = nsl ? pct(slow, nsl, 0.5) : 0
	m = 0
	for (i = 1; i <= n; i++) {
		if (named[i]) {
			v[++m] = lat[i]
			printf "injection %d: rank %d named after %.2fs (~%.1f steps); its steps %.3fs%s\n", i, rank[i], lat[i], sst ? lat[i] / sst : -1, sl[i], (i in thr) ? "; " thr[i] : ""
		} else printf "MISSED injection %d: rank %d (slow %.1fs); its steps %.3fs%s\n", i, rank[i], until[i] ? (until[i] - at[i]) / 1000 : -1, sl[i], (i in thr) ? "; " thr[i] : ""
	}
	sortv(v, m)
	printf "\ninjections %d, named %d (recall %.2f), false verdicts %d (precision %s), repeats %d, hang verdicts %d\n", n, tp, n ? tp / n : 0, fp, (tp + fp) ? sprintf("%.2f", tp / (tp + fp)) : "n/a: no verdict", rep, hangs
	if (nsl && nfa) printf "step time: slowed %.3fs (median of %d windows), clean %.3fs (median of %d gaps): %.2fx\n", sst, nsl, pct(fast, nfa, 0.5), nfa, sst / pct(fast, nfa, 0.5)
	if (m) printf "latency s: min %.2f median %.2f p90 %.2f max %.2f\n", v[1], pct(v, m, 0.5), pct(v, m, 0.9), v[m]
	if (m && sst) printf "latency steps (over the slowed step time): min %.1f median %.1f p90 %.1f max %.1f\n", v[1] / sst, pct(v, m, 0.5) / sst, pct(v, m, 0.9) / sst, v[m] / sst
	if (nl) printf "load average (1 min) over the run: mean %.2f\n", load / nl
}' "$work/out.txt" >&3
echo "raw output: $work/out.txt"
