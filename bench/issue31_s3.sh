#!/usr/bin/env bash
# On the one-GPU machine: one script for each call
# (PHASES picks the parts, in order). Binaries come as $GPU_DIR/bin.tar.xz
# (gotrain, testprog, shrinkgrow built on the Go machine), NCCL either as its
# source ($GPU_DIR/nccl-src.tar.xz: git archive v2.30.7-1 src makefiles
# Makefile of NVIDIA/nccl, built here for sm_90 and sent back under $OUT) or
# already built ($GPU_DIR/libnccl-2.30.7.tar.xz). Raw logs come back as
# $OUT/raw.tar.xz, a summary as $OUT/summary.txt.
#
#   PHASES="nccl torch first collectives3" bash bench/issue31_s3.sh       # call 1
#   (or from a copy of bench/ in build/gpu: cd build/gpu && GPU_DIR=. PHASES=... bash bench/issue31_s3.sh)
#   PHASES="nccl cycles first" bash bench/issue31_s3.sh                   # call 2
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-560} # seconds: no part starts after this
GPU_DIR=${GPU_DIR:-build/gpu} # the binaries and NCCL, relative to the repository root
R=/tmp/raw
mkdir -p "$R" /tmp/w /tmp/nccl230 "$OUT"
sum=$OUT/summary.txt
log() { echo "[$SECONDS s] $*" | tee -a "$sum" >&2; }
tar -xJf "$GPU_DIR"/bin.tar.xz -C /tmp/w || exit 2
BIN=/tmp/w
{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nvidia-smi | sed -n 3p
	nvcc --version | tail -n 2
	echo "cpus $(nproc); kernel $(uname -r)"
	nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
} >"$R/machine.txt" 2>&1
cat "$R/machine.txt" >>"$sum"
finish() {
	tar -cJf "$OUT/raw.tar.xz" -C "$R" . 2>/dev/null
	log "done"
}
trap finish EXIT

for phase in $PHASES; do
	if ((SECONDS > DEADLINE)); then
		log "deadline: skipped $phase"
		continue
	fi
	log "== $phase"
	case $phase in
	nccl)
		if [[ -e /tmp/nccl230/libnccl.so.2.30.7 ]]; then
			NCCL_TB=/tmp/libnccl-2.30.7.tar.xz # built by an earlier run on this machine
		elif [[ -e "$GPU_DIR"/libnccl-2.30.7.tar.xz ]]; then
			tar -xJf "$GPU_DIR"/libnccl-2.30.7.tar.xz -C /tmp/nccl230 || exit 2
			NCCL_TB="$GPU_DIR"/libnccl-2.30.7.tar.xz
		else
			mkdir -p /tmp/ncclsrc && tar -xJf "$GPU_DIR"/nccl-src.tar.xz -C /tmp/ncclsrc || exit 2
			t=$SECONDS
			(cd /tmp/ncclsrc && make -j"$(nproc)" src.build NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90") >"$R/nccl-build.log" 2>&1 || {
				tail -n 30 "$R/nccl-build.log" >&2
				exit 2
			}
			log "NCCL built in $((SECONDS - t)) s"
			cp -a /tmp/ncclsrc/build/lib/libnccl.so* /tmp/nccl230/
			strip --strip-unneeded /tmp/nccl230/libnccl.so.2.*
			# Files come back at most 16 MiB each: the tarball (about 30 MB) in parts.
			tar -cJf /tmp/libnccl-2.30.7.tar.xz -C /tmp/nccl230 . && ls -la /tmp/libnccl-2.30.7.tar.xz >>"$sum"
			split -b 15M -d /tmp/libnccl-2.30.7.tar.xz "$OUT/libnccl-2.30.7.tar.xz.part"
			NCCL_TB=/tmp/libnccl-2.30.7.tar.xz
		fi
		export GOTRAIN_NCCL_LIBRARY=/tmp/nccl230/libnccl.so.2
		ls -la /tmp/nccl230 >>"$sum"
		;;
	torch)
		BIN=$BIN NCCL_LIB=/tmp/nccl230/libnccl.so.2 OUT_DIR=$R/torch bash bench/torch_ddp_shared_gpu.sh >/dev/null 2>&1
		cat "$R/torch/ddp-summary.txt" >>"$sum"
		;;
	first)
		BIN=$BIN RUNS=${RUNS:-15} DEADLINE=$((DEADLINE - SECONDS < ${FIRST_BUDGET:-100} ? DEADLINE - SECONDS : ${FIRST_BUDGET:-100})) OUT_DIR=$R/first bash bench/shrinkgrow_first.sh >/dev/null 2>&1
		tail -n 3 "$R/first/first-summary.txt" >>"$sum"
		;;
	collectives3)
		for op in all_gather reduce_scatter broadcast; do
			timeout -k 5 90 "$BIN"/gotrain bench "$op" --gpus 3 --ranks-per-gpu 3 --max 16M --iters 10 >"$R/$op-3.log" 2>&1
			echo "$op-3 exit=$? $(grep -E 'Out of bounds' "$R/$op-3.log")" >>"$sum"
		done
		timeout -k 5 90 "$BIN"/gotrain bench allreduce --gpus 3 --ranks-per-gpu 3 --max 4M --dtype int64 --op min --iters 5 >"$R/allreduce-int64-min-3.log" 2>&1
		echo "allreduce-int64-min-3 exit=$? $(grep -E 'Out of bounds' "$R/allreduce-int64-min-3.log")" >>"$sum"
		;;
	cycles)
		for cfg in ${CONFIGS:-shrink:abort reinit}; do
			((SECONDS > DEADLINE)) && break
			CYCLES=${CYCLES:-200} CYCLE_TIMEOUT=10s STEP_TIMEOUT=${STEP_TIMEOUT:-200} BIN=$BIN OUT_DIR=$R/cycles \
				NCCL_TARBALL=$NCCL_TB bash bench/shrinkgrow.sh "$cfg" 2>>"$sum" >/dev/null
		done
		;;
	*) log "unknown phase $phase" ;;
	esac
done
