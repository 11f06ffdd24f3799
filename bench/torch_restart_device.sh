#!/usr/bin/env bash
# bench/torch_restart.sh on a GPU machine without Go, in one call: gotrain
# comes prebuilt in build/gpubin.tgz (made on the development machine:
#   go build -ldflags='-s -w' -o build/gpubin/gotrain ./cmd/gotrain
#   tar -czf build/gpubin.tgz -C build/gpubin gotrain
# ). PART=main: the GPU memory a Python standby holds (its CUDA context),
# then the NCCL restart bench; PART=lightning: the Lightning program with
# --standby-preload lightning against torchrun. Results and one tarball of
# the raw logs go to OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY=${PY:-/opt/torch/.venv/bin/python}
OUT=${OUT:-/tmp/torch-restart-out}
PART=${PART:-main}
NPROC=${NPROC:-1}
RUNS=${RUNS:-5}
mkdir -p bin "$OUT" && tar -xzf build/gpubin.tgz -C bin || exit 1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
"$PY" -c 'import lightning; print("lightning", lightning.__version__)' 2>&1 | tail -1

if [[ $PART == main ]]; then
	# A job whose rank never touches CUDA: the GPU memory in use is its
	# standby's (CUDA context, torch's CUDA state, one allocator block).
	used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
	printf 'import time\ntime.sleep(40)\n' >/tmp/sleep40.py
	before=$(used)
	bin/gotrain launch --verbose --nproc-per-node 1 --backend nccl -- "$PY" /tmp/sleep40.py >/tmp/mem.out 2>/tmp/mem.err &
	job=$!
	for _ in $(seq 600); do grep -q 'standby ready' /tmp/mem.err && break; sleep 0.1; done
	sleep 1
	spid=$(grep -o 'msg="standby ready".* pid=[0-9]*' /tmp/mem.err | grep -o 'pid=[0-9]*$' | cut -d= -f2)
	{
		echo "GPU memory used before: ${before} MiB; with one Python standby ready: $(used) MiB"
		grep -o 'msg="python standby warm".*' /tmp/mem.err
		nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
		[[ -n $spid ]] && grep VmRSS "/proc/$spid/status" | sed "s/^/standby pid $spid /"
	} | tee "$OUT/standby-memory.txt"
	kill "$job"; wait "$job"
	BACKEND=nccl NPROC=$NPROC RUNS=$RUNS CRASH_AFTER=${CRASH_AFTER:-6} PYTHON=$PY TORCHRUN="$(dirname "$PY")/torchrun" TAG=nccl \
		RESULTS_DIR="$OUT" bash bench/torch_restart.sh
else
	BACKEND=nccl NPROC=$NPROC RUNS=${RUNS:-3} CRASH_AFTER=${CRASH_AFTER:-20} PYTHON=$PY TORCHRUN="$(dirname "$PY")/torchrun" TAG=nccl-lightning \
		PROG=bench/torch_restart_lightning.py PRELOAD=lightning MODES="gotrain torchrun" RESULTS_DIR="$OUT" bash bench/torch_restart.sh
fi
cd "$OUT" && tar -czf "raw-$PART.tgz" torch-restart-raw-* && rm -rf torch-restart-raw-*
