#!/usr/bin/env bash
# An unchanged PyTorch program (bench/torch_restart.py), crash -> first
# all-reduce of the restarted group, side by side in one run:
#   gotrain            gotrain launch --standby=auto: restarted ranks take
#                      over Python standbys (warm interpreters, torch imported,
#                      CUDA initialised)
#   gotrain-nostandby  gotrain launch --standby=off: fresh interpreters
#   gotrain-nostorewait  as gotrain, but the ranks do not wait for rank 0's
#                      TCPStore (GOTRAIN_STANDBY_STORE_WAIT=off): torch's 1 s retry
#   torchrun           torchrun --standalone --max-restarts 1
# Same method as bench/restart.sh and bench/anchors/torch_restart.py: the
# last rank writes the time and exits 1 CRASH_AFTER s after the first
# all-reduce (long enough for the standbys to be warm, as in any real job);
# every rank of the next attempt prints the time from that crash to its
# first all-reduce. A run's number is the slowest rank's.
#
# Any GPU count (NCCL) or CPU ranks (gloo):
#   make build
#   BACKEND=nccl NPROC=1 RUNS=5 PYTHON=/opt/torch/.venv/bin/python bash bench/torch_restart.sh
#   BACKEND=cpu NPROC=2 RUNS=5 PYTHON=/usr/bin/python3 bash bench/torch_restart.sh
# torchrun is TORCHRUN (default: PYTHON -m torch.distributed.run). MODES picks
# the launchers; RUNS_<mode> (dashes as underscores, e.g. RUNS_torchrun=5)
# runs that mode fewer or more times than RUNS; PRELOAD is --standby-preload; PROG another program taking
# the same flags. Writes RESULTS_DIR/torch-restart-<date>-<backend>.md and
# keeps raw logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin}
BACKEND=${BACKEND:-nccl}
NPROC=${NPROC:-1}
RUNS=${RUNS:-5}
PYTHON=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-$PYTHON -m torch.distributed.run}
# TORCHRUN_ARGS: more torchrun flags. Debian's torch 1.13 under Python 3.11
# needs "--redirects 1 --tee 1" (its default "0" parses to None there).
TORCHRUN_ARGS=${TORCHRUN_ARGS:-}
CRASH_AFTER=${CRASH_AFTER:-8}
MODES=${MODES:-gotrain gotrain-nostandby torchrun}
PRELOAD=${PRELOAD:-}
PROG=${PROG:-bench/torch_restart.py}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
TAG=${TAG:-$BACKEND}
date=$(date -u +%Y-%m-%d)
work="$RESULTS_DIR/torch-restart-raw-$date-$TAG"
mkdir -p "$RESULTS_DIR" "$work"
pyback=gloo
[[ $BACKEND == nccl ]] && pyback=nccl

# slowest FILE: the largest recovered_in of the RESTART lines in FILE.
slowest() { grep -o 'recovered_in=[0-9.]*' "$1" | cut -d= -f2 | sort -g | tail -1; }
# stats: min median max of the numbers on stdin.
stats() { sort -g | awk '{a[NR]=$1} END {if (!NR) {print "- - -"; exit} print a[1], (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2), a[NR]}'; }

declare -A results warm
most=$RUNS
for mode in $MODES; do
	n=RUNS_${mode//-/_}
	((${!n:-$RUNS} > most)) && most=${!n}
done
for i in $(seq "$most"); do
	for mode in $MODES; do
		n=RUNS_${mode//-/_}
		((i > ${!n:-$RUNS})) && continue
		rm -f "$work/mark"
		out="$work/$mode-$i.out" err="$work/$mode-$i.err"
		args=(--mark "$work/mark" --crash-after "$CRASH_AFTER" --backend "$pyback")
		case $mode in
		gotrain | gotrain-nostandby | gotrain-nostorewait)
			standby=auto
			[[ $mode == gotrain-nostandby ]] && standby=off
			# gotrain-nostorewait: standbys whose ranks do not wait for rank
			# 0's TCPStore.
			export GOTRAIN_STANDBY_STORE_WAIT=on
			[[ $mode == gotrain-nostorewait ]] && export GOTRAIN_STANDBY_STORE_WAIT=off
			pre=()
			[[ -n $PRELOAD ]] && pre=(--standby-preload "$PRELOAD")
			timeout -k 5 120 "$BIN"/gotrain launch --nproc-per-node "$NPROC" --backend "$BACKEND" --max-restarts 1 --grace-period 5s \
				--standby="$standby" "${pre[@]}" -- "$PYTHON" "$PROG" "${args[@]}" >"$out" 2>"$err"
			;;
		torchrun)
			# shellcheck disable=SC2086 # TORCHRUN ("python -m torch.distributed.run") and TORCHRUN_ARGS split
			timeout -k 5 120 $TORCHRUN --standalone --nproc_per_node "$NPROC" --max_restarts 1 $TORCHRUN_ARGS "$PROG" "${args[@]}" >"$out" 2>"$err"
			;;
		esac
		rc=$?
		t=$(slowest "$out")
		w=$(grep -c 'warm=True' "$out")
		echo "$mode run $i: exit $rc, slowest rank back after ${t:-?} s (warm ranks: $w)" >&2
		((rc == 0)) || tail -5 "$err" >&2
		results[$mode]+="${t:-fail} "
		warm[$mode]+="$w "
	done
done

out="$RESULTS_DIR/torch-restart-$date-$TAG.md"
{
	echo "# PyTorch crash -> first all-reduce of the restarted group ($date, $BACKEND, $NPROC rank(s))"
	echo
	echo "machine: $(hostname), $(nproc) CPUs, $(uname -r)"
	nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
	echo "python: $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1 | tail -1)"
	echo "gotrain: $("$BIN"/gotrain version 2>/dev/null | head -1)"
	echo "program: $PROG --crash-after $CRASH_AFTER --backend $pyback${PRELOAD:+ (gotrain: --standby-preload $PRELOAD)}"
	echo
	echo "| launcher | runs (s, slowest rank) | min | median | max | ranks served warm |"
	echo "|---|---|---|---|---|---|"
	for k in $MODES; do
		read -r lo med hi < <(echo "${results[$k]:-}" | tr ' ' '\n' | grep -v '^$' | grep -v fail | stats)
		echo "| $k | ${results[$k]:-}| $lo | $med | $hi | ${warm[$k]:-}|"
	done
	echo
	echo "Commands:"
	echo
	echo '```'
	echo "gotrain launch --nproc-per-node $NPROC --backend $BACKEND --max-restarts 1 --grace-period 5s --standby=auto${PRELOAD:+ --standby-preload $PRELOAD} -- $PYTHON $PROG --mark MARK --crash-after $CRASH_AFTER --backend $pyback"
	echo "$TORCHRUN --standalone --nproc_per_node $NPROC --max_restarts 1 ${TORCHRUN_ARGS:+$TORCHRUN_ARGS }$PROG --mark MARK --crash-after $CRASH_AFTER --backend $pyback"
	echo '```'
} >"$out"
cat "$out"
echo "wrote $out (raw logs in $work)" >&2
