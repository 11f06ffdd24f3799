#!/usr/bin/env bash
# Hangs and stragglers of unchanged PyTorch programs on gloo, seen through gotrain's PyTorch hook (internal/torchhook), and what the
# hook costs. Three parts, one markdown report (RESULT):
#
#   overhead   bench/torch_hook_overhead.py as 2 gloo ranks, without and with
#              the hook, alternating ROUNDS times: µs per all_reduce of one
#              element and per DDP step (medians).
#   hangs      INJECTIONS runs of `gotrain launch` (RANKS CPU ranks, no
#              --hang-timeout: the adaptive timeout) of
#              internal/testing/integration/testdata/gloo_hang.py, 0.2 s steps with
#              ±50 ms jitter; in run i rank i mod RANKS stops calling
#              collectives at a random step in [50, 80] (alternately
#              sleeping and spinning in Python), after the 10 s or so the
#              adaptive timeout needs to learn the job's rhythm. A run is a true detection
#              when the verdict names that rank and the all-reduce it never
#              entered; latency is from the rank's FAULT line (its clock) to
#              the moment the bench read the agent's verdict line.
#   clean      one run of CLEAN_SECS with no fault: every verdict is false.
#
#   bash bench/torch_gloo_hangs.sh                 # from the repository root
#   INJECTIONS=20 PY=/opt/torch/.venv/bin/python bash bench/torch_gloo_hangs.sh
set -uo pipefail
cd "$(dirname "$0")/.."

export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin}
if [[ -z ${PY:-} ]]; then
	PY=/usr/bin/python3
	[[ -x /opt/torch/.venv/bin/python ]] && PY=/opt/torch/.venv/bin/python
fi
INJECTIONS=${INJECTIONS:-10}
RANKS=${RANKS:-3}
CLEAN_SECS=${CLEAN_SECS:-60}
ROUNDS=${ROUNDS:-3}
RESULT=${RESULT:-bench/results/torch-gloo-hangs-$(date -u +%Y-%m-%d).md}
prog=internal/testing/integration/testdata/gloo_hang.py

if [[ ! -x $BIN/gotrain ]]; then
	echo "bench: $BIN/gotrain is missing: build it with: go build -o $BIN/gotrain ./cmd/gotrain" >&2
	exit 1
fi
if ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
	echo "bench: $PY does not import torch with gloo: set PY, or apt-get install python3-torch" >&2
	exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$RESULT")" "$work/hook" "$work/records"
cp internal/torchhook/sitecustomize.py "$work/hook/"
torchv=$("$PY" -c 'import torch; print(torch.__version__)')
now_ms() { date +%s%3N; }

# overhead: WITH=1 puts the hook on PYTHONPATH.
overhead() {
	local with=$1 port=$((20000 + RANDOM % 9000)) pids=() r
	for ((r = 0; r < 2; r++)); do
		env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
			${with:+PYTHONPATH=$work/hook GOTRAIN_TORCH_PROGRESS_DIR=$work/records} \
			"$PY" bench/torch_hook_overhead.py >"$work/over-$r.txt" 2>&1 &
		pids+=($!)
	done
	wait "${pids[@]}"
	cat "$work/over-0.txt"
}
declare -A sum
for ((i = 0; i < ROUNDS; i++)); do
	for with in "" 1; do
		key=${with:-0}
		while read -r _ name us; do
			sum[$key.$name]+="$us "
		done < <(overhead "$with" | grep '^overhead ')
	done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# one launch; prints "LATENCY_MS OK|WRONG|NONE VERDICT_LINE".
inject() {
	local fault=$1 rank=$2 step=$3 out=$work/run.out errf=$work/run.err
	"$BIN/gotrain" launch --nproc-per-node "$RANKS" --backend cpu --max-restarts 0 --grace-period 1s -- \
		"$PY" "$prog" --fault "$fault" --fault-rank "$rank" --fault-step "$step" --jitter 0.05 >"$out" 2>"$errf" &
	local job=$! fault_ms="" seen="" deadline=$((SECONDS + 240))
	while ((SECONDS < deadline)); do
		if [[ -z $fault_ms ]]; then
			fault_ms=$(grep -o 'FAULT [a-z]* rank [0-9]* seq [0-9]* unix_ms [0-9]*' "$out" 2>/dev/null | awk '{print $NF}')
			[[ -n $fault_ms ]] && deadline=$((SECONDS + 90))
		fi
		seen=$(grep -m1 '^gotrain: hang detected' "$errf" 2>/dev/null)
		[[ -n $seen ]] && break
		kill -0 "$job" 2>/dev/null || break
		sleep 0.1
	done
	local at
	at=$(now_ms)
	kill -TERM "$job" 2>/dev/null
	wait "$job" 2>/dev/null
	if [[ -z $seen || -z $fault_ms ]]; then
		echo "- NONE ${seen:-no verdict}"
		return
	fi
	local verdict=WRONG
	[[ $seen == *"rank $rank ("*"never entered allreduce #$((step + 1)) "* ]] && verdict=OK
	echo "$((at - fault_ms)) $verdict $seen"
}

: >"$work/hangs.txt"
for ((i = 1; i <= INJECTIONS; i++)); do
	fault=stop
	((i % 2 == 0)) && fault=spin
	rank=$((i % RANKS)) step=$((50 + RANDOM % 31))
	res=$(inject "$fault" "$rank" "$step")
	echo "$i $fault rank $rank step $step: $res" | tee -a "$work/hangs.txt" >&2
done

# clean: no fault for CLEAN_SECS.
"$BIN/gotrain" launch --nproc-per-node "$RANKS" --backend cpu --max-restarts 0 --grace-period 1s -- \
	"$PY" "$prog" --fault none --jitter 0.05 --steps $((CLEAN_SECS * 5)) >"$work/clean.out" 2>"$work/clean.err"
clean_rc=$?
false_verdicts=$(grep -c '^gotrain: hang detected\|^gotrain: straggler' "$work/clean.err")

ok=$(grep -c ' OK ' "$work/hangs.txt")
wrong=$(grep -c ' WRONG ' "$work/hangs.txt")
none=$(grep -c ' NONE ' "$work/hangs.txt")
lat=$(grep ' OK ' "$work/hangs.txt" | awk -F': ' '{split($2, a, " "); print a[1] / 1000}' | sort -g)
{
	echo "# PyTorch on gloo: hangs named through gotrain's hook ($(date -u +%Y-%m-%d))"
	echo
	echo "Machine: $(nproc) CPUs, $(uname -sr); torch $torchv ($PY); gotrain $("$BIN/gotrain" version 2>/dev/null | head -1)."
	echo "Command: \`INJECTIONS=$INJECTIONS RANKS=$RANKS CLEAN_SECS=$CLEAN_SECS bash bench/torch_gloo_hangs.sh\`."
	echo
	echo "## Overhead (2 gloo ranks, medians of $ROUNDS rounds × 5 repeats)"
	echo
	echo "| measure | without the hook | with the hook | ratio |"
	echo "| --- | --- | --- | --- |"
	for name in all_reduce_us ddp_step_us; do
		a=$(echo "${sum[0.$name]:-}" | median) b=$(echo "${sum[1.$name]:-}" | median)
		echo "| $name | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN {if (a > 0) printf "%.3f", b / a}') |"
	done
	echo
	echo "## Hangs ($INJECTIONS injections, adaptive timeout, $RANKS ranks)"
	echo
	echo "- named correctly (rank and collective): $ok; wrong verdict: $wrong; no verdict: $none"
	echo "- precision $(awk -v o="$ok" -v w="$wrong" 'BEGIN {printf "%.2f", (o + w) ? o / (o + w) : 0}'), recall $(awk -v o="$ok" -v n="$INJECTIONS" 'BEGIN {printf "%.2f", o / n}')"
	if [[ -n $lat ]]; then
		echo "- latency fault → verdict read (s): median $(echo "$lat" | median), min $(echo "$lat" | head -1), max $(echo "$lat" | tail -1)"
	fi
	echo
	echo "## Clean run ($CLEAN_SECS s, no fault)"
	echo
	echo "- exit status $clean_rc; false verdicts (hang or straggler): $false_verdicts"
	echo
	echo "## Runs"
	echo
	echo '```'
	cat "$work/hangs.txt"
	echo '```'
} >"$RESULT"
cat "$RESULT"
