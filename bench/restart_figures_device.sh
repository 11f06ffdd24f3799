#!/usr/bin/env bash
# Restart figures on a GPU machine without Go, in one call per PART; the
# binaries come prebuilt in build/gpu/restart-bins.tgz, made on the
# development machine:
#   go build -trimpath -ldflags='-s -w' -o build/gpu/bins/new/gotrain ./cmd/gotrain
#   go build -trimpath -ldflags='-s -w' -o build/gpu/bins/new/testprog ./internal/testing/integration/testprog
#   (the same from a worktree of the "before" commit into build/gpu/bins/old)
#   tar -czf build/gpu/restart-bins.tgz -C build/gpu/bins .
# PART=state: bench/restart_quick.sh with the before and after binaries,
#   alternated (ROUNDS times each), one rank on the GPU.
# PART=torch-cpu / PART=torch-nccl: bench/torch_restart.sh, gotrain RUNS
#   times and torchrun TORCH_RUNS times, CPU gloo (NPROC 2) or NCCL
#   (NPROC 1).
# Results go to OUT (the device's $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY=${PY:-/opt/torch/.venv/bin/python}
OUT=${OUT:-/tmp/restart-figures}
PART=${PART:-state}
mkdir -p bins "$OUT" && tar -xzf build/gpu/restart-bins.tgz -C bins || exit 1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'

case $PART in
state)
	for round in $(seq "${ROUNDS:-3}"); do
		for v in new old; do
			BIN=bins/$v GPUS=1 SPLIT_AB=0 STANDBY=1 BUDGET=${BUDGET:-40} RESULTS_DIR="$OUT/state-$v-$round" \
				bash bench/restart_quick.sh >/dev/null 2>"$OUT/state-$v-$round.summary"
			sed "s/^/$v round $round: /" "$OUT/state-$v-$round.summary"
		done
	done
	;;
torch-cpu)
	BIN=bins/new BACKEND=cpu NPROC=2 RUNS=${RUNS:-20} RUNS_torchrun=${TORCH_RUNS:-5} MODES="gotrain torchrun" \
		CRASH_AFTER=${CRASH_AFTER:-3} PYTHON=$PY RESULTS_DIR="$OUT" bash bench/torch_restart.sh
	;;
torch-nccl)
	BIN=bins/new BACKEND=nccl NPROC=1 RUNS=${RUNS:-20} RUNS_torchrun=${TORCH_RUNS:-5} MODES="gotrain torchrun" \
		CRASH_AFTER=${CRASH_AFTER:-3} PYTHON=$PY RESULTS_DIR="$OUT" bash bench/torch_restart.sh
	;;
*)
	echo "PART is state, torch-cpu or torch-nccl" >&2
	exit 2
	;;
esac
# The raw logs as one file (the device returns plain files, not too many).
tar -czf "$OUT/raw.tgz" -C "$OUT" --exclude raw.tgz . 2>/dev/null
