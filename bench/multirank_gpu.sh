#!/usr/bin/env bash
# More than two NCCL ranks on one GPU (NCCL ≥ 2.30's multi-rank-per-GPU,
# gotrain launch --ranks-per-gpu): every collective of `gotrain bench`
# checked at 3, 4 and 8 ranks, DataParallel through an in-process recovery
# at 4 and 8, a hang named at 8, restarts at 8 (process restart and
# in-process recovery), and the refusal of --ranks-per-gpu on an NCCL older
# than 2.30. One call on the GPU machine; each step has a timeout.
#
# NCCL 2.30 is built on the GPU machine from its source (NVIDIA/nccl tag
# v2.30.7-1, sm_90 only: make -j16 src.build
# NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"), its stripped
# libnccl.so.2 carried as NCCL_TARBALL (a tar.xz of libnccl.so*).
#
#   go build -o bin/gotrain ./cmd/gotrain; go build -o bin/testprog ./internal/testing/integration/testprog
#   NCCL_TARBALL=build/nccl230/nccl.tar.xz bash bench/multirank_gpu.sh   # on the GPU machine
#
# Writes RESULTS_DIR/multirank-<date>.md (default bench/results) and the
# raw logs beside it; exits non-zero when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BIN=${BIN:-bin}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
RANKS=${RANKS:-3 4 8}
date=$(date -u +%Y-%m-%d)
raw="$RESULTS_DIR/multirank-raw-$date"
mkdir -p "$raw"
: >"$raw/steps.md"
failed=0

lib=/tmp/nccl230
mkdir -p "$lib"
tar -xJf "${NCCL_TARBALL:-build/nccl230/nccl.tar.xz}" -C "$lib" || exit 2
old_nccl=${GOTRAIN_NCCL_LIBRARY:-}
export GOTRAIN_NCCL_LIBRARY=$lib/libnccl.so.2

# step NAME WANT CMD...: runs CMD (timeout STEP_TIMEOUT), logs it to
# NAME.log, and records PASS when its exit status is WANT.
step() {
	local name=$1 want=$2
	shift 2
	local start=$SECONDS
	echo "== $name: $*" >&2
	timeout -k 5 "${STEP_TIMEOUT:-90}" "$@" >"$raw/$name.log" 2>&1
	local rc=$? verdict=PASS
	if ((rc != want)); then
		verdict="FAIL (exit $rc, want $want)"
		failed=1
		tail -n 8 "$raw/$name.log" >&2
	fi
	printf '| %s | %s | %ds | `%s` |\n' "$name" "$verdict" $((SECONDS - start)) "$*" >>"$raw/steps.md"
}

step doctor 0 "$BIN"/gotrain doctor
# The NCCL the GPU machine ships (2.28) cannot share a GPU: refused at once.
if [[ -e /usr/lib/x86_64-linux-gnu/libnccl.so.2 ]]; then
	step refuse-old-nccl 1 env GOTRAIN_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2 "$BIN"/gotrain launch --nproc-per-node 2 --ranks-per-gpu 2 -- true
fi
for n in $RANKS; do
	# At 8 ranks every all-reduce takes 60-250 ms (time slices): its 12
	# sizes × 25 all-reduces need minutes, not the default step time.
	STEP_TIMEOUT=$((n >= 8 ? ${ALLREDUCE8_TIMEOUT:-300} : ${STEP_TIMEOUT:-90})) \
		step "allreduce-$n" 0 "$BIN"/gotrain bench allreduce --gpus "$n" --ranks-per-gpu "$n" --max 64M --iters 20
	((n == 3)) && continue # 3 ranks: all-reduce only, to keep the call short
	for op in all_gather reduce_scatter broadcast; do
		step "$op-$n" 0 "$BIN"/gotrain bench "$op" --gpus "$n" --ranks-per-gpu "$n" --max 16M --iters 10
	done
	step "allreduce-int64-min-$n" 0 "$BIN"/gotrain bench allreduce --gpus "$n" --ranks-per-gpu "$n" --max 4M --dtype int64 --op min --iters 5
done
# DataParallel through an in-process recovery on both transports (auto
# takes the copy engines where ranks share a GPU: worker/nodereduce).
for n in 4 8; do
	for tr in nccl copy-engine; do
		step "dataparallel-recovery-$tr-$n" 0 "$BIN"/gotrain launch --nproc-per-node "$n" --ranks-per-gpu "$n" --backend nccl --max-restarts 1 -- "$BIN"/testprog dataparallel --transport "$tr"
	done
done
# Restarts at 8 ranks: rank 1 dies after the first all-reduce; the log has
# recovered_in= (death to the slowest rank's first all-reduce again).
for mode in process inprocess; do
	flag=
	[[ $mode == inprocess ]] && flag=--inprocess
	step "restart-8-$mode" 0 "$BIN"/gotrain launch --verbose --nproc-per-node 8 --ranks-per-gpu 8 --backend nccl --max-restarts 1 --grace-period 5s -- "$BIN"/testprog restart --mark "$raw/mark-$mode" $flag
done
# A hang at 8 ranks: rank 5 skips all-reduce #3; the verdict must name it
# (the job then waits, --on-hang report, until the step's timeout stops it).
STEP_TIMEOUT=40 step hang-8 124 "$BIN"/gotrain launch --nproc-per-node 8 --ranks-per-gpu 8 --backend nccl --max-restarts 0 --hang-timeout 5s -- "$BIN"/testprog hang --fault skip --fault-rank 5 --fault-step 3 --step-time 50ms
if ! grep -q 'hang detected.*rank 5 ' "$raw/hang-8.log"; then
	echo '| hang-8-verdict | FAIL (no verdict naming rank 5) | | |' >>"$raw/steps.md"
	failed=1
fi

out="$RESULTS_DIR/multirank-$date.md"
{
	echo "# More than two NCCL ranks on one GPU, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "$(hostname), $(nproc) CPUs; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); NCCL 2.30.7 built there for sm_90 (GOTRAIN_NCCL_LIBRARY); gotrain $("$BIN"/gotrain version 2>/dev/null | head -1)"
	echo
	echo "| step | result | took | command |"
	echo "|---|---|---:|---|"
	cat "$raw/steps.md"
	echo
	echo "## doctor (NCCL line)"
	echo '```'
	grep -i nccl "$raw/doctor.log"
	echo '```'
	for n in $RANKS; do
		echo
		echo "## gotrain bench at $n ranks on one GPU"
		for op in allreduce all_gather reduce_scatter broadcast allreduce-int64-min; do
			echo
			[[ -e $raw/$op-$n.log ]] || continue
			echo '```'
			grep -v '^\[rank' "$raw/$op-$n.log" | tail -n 20
			echo '```'
		done
	done
	echo
	echo "## Restarts at 8 ranks (recovered_in: death to the slowest rank's first all-reduce)"
	echo '```'
	for mode in process inprocess; do
		echo "$mode: $(grep -o 'recovered_in=[0-9.]*' "$raw/restart-8-$mode.log" | cut -d= -f2 | sort -g | tail -1) s"
	done
	echo '```'
	echo
	echo "## Hang at 8 ranks: the verdict"
	echo '```'
	grep -v '^\[rank' "$raw/hang-8.log" | tail -n 15
	echo '```'
} >"$out"
rm -f "$raw/steps.md"
echo "wrote $out" >&2
exit $failed
