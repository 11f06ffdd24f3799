#!/usr/bin/env bash
# The copy-engine all-reduce past two ranks (worker/nodereduce) against
# NCCL's on one GPU shared by 2, 4 and 8 ranks (NCCL ≥ 2.30's
# multi-rank-per-GPU), in one call on the GPU machine:
#   1. builds NCCL 2.30.7 for sm_90 from its source (NCCL_SRC, a tar.xz of
#      NVIDIA/nccl's tag v2.30.7-1: git archive v2.30.7-1 src makefiles
#      Makefile | xz), unless NCCL_TARBALL (a tar.xz of libnccl.so*) is given;
#      meanwhile runs worker/nodereduce's GPU tests (no NCCL needed);
#   2. bench/nodereduce (built as BIN/nodebench) under gotrain launch at each
#      of RANKS ranks: NCCL's and the copy engines' all-reduce side by side;
#   3. DataParallel on the copy engines through an in-process recovery
#      (testprog dataparallel --transport copy-engine), and auto's choice;
#   4. whether PyTorch's libtorch_cuda links libnccl dynamically and
#      whether an LD_PRELOADed NCCL 2.30.7 is the one it uses.
#
#   go build -o BIN/gotrain ./cmd/gotrain; go build -o BIN/testprog ./internal/testing/integration/testprog
#   go build -o BIN/nodebench ./bench/nodereduce; go test -c -o BIN/nodereduce.test ./worker/nodereduce
#   BIN=... NCCL_SRC=nccl.tar.xz OUTDIR=... bash bench/nodereduce_gpu.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BIN=${BIN:-bin}
OUTDIR=${OUTDIR:-/tmp/nodereduce-out}
RANKS=${RANKS:-2 4 8}
MAX=${MAX:-64M}
mkdir -p "$OUTDIR"
W=$(mktemp -d)
lib=$W/lib
mkdir -p "$lib"
{
	hostname; nproc
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$OUTDIR/machine.txt" 2>&1

t0=$SECONDS
if [[ -n ${NCCL_TARBALL:-} ]]; then
	tar -xJf "$NCCL_TARBALL" -C "$lib" || exit 2
	build=
else
	mkdir -p "$W/nccl"
	tar -xJf "$NCCL_SRC" -C "$W/nccl" || exit 2
	(cd "$W/nccl" && make -j16 src.build NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$W/nccl-build.log" 2>&1) &
	build=$!
fi
echo "== nodereduce GPU tests" >&2
GOTRAIN_REQUIRE_GPU=1 timeout -k 5 300 "$BIN"/nodereduce.test -test.v -test.run GPU >"$OUTDIR/nodereduce-gpu-tests.log" 2>&1
echo "nodereduce GPU tests: exit $?" | tee -a "$OUTDIR/summary.txt"
grep -E '^(---|===|ok|FAIL|PASS)' "$OUTDIR/nodereduce-gpu-tests.log" | grep -v RUN >&2
if [[ -n $build ]]; then
	wait "$build"
	rc=$?
	echo "NCCL build: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUTDIR/summary.txt"
	((rc == 0)) || { tail -n 30 "$W/nccl-build.log" >&2; exit 2; }
	cp -a "$W"/nccl/build/lib/libnccl.so* "$lib"/
	rm -f "$lib"/libnccl_static.a
	strip --strip-unneeded "$lib"/libnccl.so.*.*.* 2>/dev/null
	tar -cJf "$OUTDIR/nccl230-lib.tar.xz" -C "$lib" . # for later calls: NCCL_TARBALL
fi
export GOTRAIN_NCCL_LIBRARY=$lib/libnccl.so.2

for n in $RANKS; do
	echo "== nodebench $n ranks" >&2
	timeout -k 5 "${BENCH_TIMEOUT:-200}" "$BIN"/gotrain launch --nproc-per-node "$n" --ranks-per-gpu "$n" --backend nccl -- \
		"$BIN"/nodebench --max "$MAX" >"$OUTDIR/nodebench-$n.log" 2>&1
	echo "nodebench $n ranks: exit $?" | tee -a "$OUTDIR/summary.txt"
	grep -E '^(\[rank 0\] )?(\||#)' "$OUTDIR/nodebench-$n.log" | sed 's/^\[rank 0\] //' | tee -a "$OUTDIR/table.md"
done
for n in 4 8; do
	for tr in copy-engine auto; do
		echo "== dataparallel $n ranks --transport $tr" >&2
		timeout -k 5 120 "$BIN"/gotrain launch --nproc-per-node "$n" --ranks-per-gpu "$n" --backend nccl --max-restarts 1 -- \
			"$BIN"/testprog dataparallel --transport "$tr" >"$OUTDIR/dataparallel-$tr-$n.log" 2>&1
		echo "dataparallel $n ranks --transport $tr (victim rank 1, in-process recovery): exit $?; $(grep -o 'transport=[a-z-]*' "$OUTDIR/dataparallel-$tr-$n.log" | sort | uniq -c | tr '\n' ' ')" | tee -a "$OUTDIR/summary.txt"
	done
done

echo "== PyTorch's NCCL" >&2
tl=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"))' 2>/dev/null)
{
	echo "libtorch_cuda: $tl"
	echo "ldd | grep nccl: $(ldd "$tl" | grep -i nccl || echo '(none)')"
	echo "DT_NEEDED: $(readelf -d "$tl" | grep -i 'NEEDED.*nccl' || echo '(none)')"
	for pre in "" "$lib/libnccl.so.2"; do
		LD_PRELOAD=$pre python3 -c 'import torch, torch.cuda.nccl as n
print("LD_PRELOAD='"$pre"': torch.cuda.nccl.version() =", n.version())
print("  mapped:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "nccl" in l}))' 2>&1 | tail -n 3
	done
} | tee "$OUTDIR/torch-nccl.txt"
cat "$OUTDIR/summary.txt"
