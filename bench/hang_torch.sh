#!/usr/bin/env bash
# Hang diagnosis for a program that does not use gotrain's worker library: a
# PyTorch job (bench/torch_hang.py) in which rank 1 stops calling all_reduce.
# The agent learns the ranks' progress from NCCL's RAS and must name rank 1
# and the all-reduce; `gotrain diagnose` shows the evidence. While the job
# runs, `gotrain top --once --json` shows the GPUs' live NVML samples.
# Writes RESULT (default bench/results/hang-torch-<date>.md).
#
#   make gpu                        # on the development machine
#   bash bench/hang_torch.sh        # on the GPU machine, from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

BIN=${BIN:-bin}
PY=${PY:-/opt/torch/.venv/bin/python}
RESULT=${RESULT:-bench/results/hang-torch-$(date -u +%Y-%m-%d).md}
TIMEOUT=${TIMEOUT:-5s}
work=$(mktemp -d)
mkdir -p "$(dirname "$RESULT")"

"$BIN/gotrain" launch --gpus 2 --backend nccl --max-restarts 0 --hang-timeout "$TIMEOUT" --verbose -- \
	"$PY" bench/torch_hang.py >"$work/out.txt" 2>"$work/err.txt" &
job=$!
start=$SECONDS
top=""
while ((SECONDS - start < 90)); do
	sleep 1
	if [[ -z $top ]] && grep -q "step 20" "$work/out.txt"; then
		top=$("$BIN/gotrain" top --once --json 2>&1)
	fi
	grep -q "hang detected\|HANG\|hang:" "$work/err.txt" && break
	kill -0 "$job" 2>/dev/null || break
done
sleep 3 # the evidence arrives after the verdict
diag=$("$BIN/gotrain" diagnose 2>&1)
kill -TERM "$job" 2>/dev/null
wait "$job"
fault=$(grep -h FAULT "$work/out.txt" | head -1)
{
	echo "# Hang diagnosis of a PyTorch job under gotrain launch ($(date -u +%Y-%m-%dT%H:%MZ))"
	echo
	echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) × $(nvidia-smi -L | wc -l);" \
		"torch $("$PY" -c 'import torch; print(torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)."
	echo "\`gotrain launch --gpus 2 --backend nccl --max-restarts 0 --hang-timeout $TIMEOUT -- python bench/torch_hang.py\`:"
	echo "rank 1 stops calling all_reduce at step 50; the program does not use gotrain's worker library, so"
	echo "the agent only has NCCL's RAS to go by."
	echo
	echo "Fault: \`$fault\`"
	echo
	echo "## The agent's verdict (stderr)"
	echo
	echo '```'
	grep -v '^time=' "$work/err.txt" | grep -v '^\[rank' | head -40
	grep -E 'msg="hang detected"' "$work/err.txt" | head -3
	echo '```'
	echo
	echo "## gotrain diagnose"
	echo
	echo '```'
	echo "$diag" | head -80
	echo '```'
	echo
	echo "## gotrain top --once --json while it ran (live NVML samples)"
	echo
	echo '```'
	echo "$top" | head -80
	echo '```'
	echo
	echo "Reproduce: \`bash bench/hang_torch.sh\` (raw logs: $work)"
} >"$RESULT"
cat "$RESULT"
# A run that never reached a verdict is a failure, whatever the job did
# (e.g. refused for want of a second GPU).
if ! grep -q "hang detected" "$work/err.txt"; then
	echo "hang_torch.sh: no hang verdict: see $work/err.txt" >&2
	exit 1
fi
