#!/usr/bin/env bash
# Shrink and grow against re-init on one GPU (bench/shrinkgrow): each
# configuration runs CYCLES failure/recovery cycles of RANKS ranks, under a
# timeout; logs and per-cycle CSVs go to OUT_DIR. One call on the GPU machine.
#
#   go build -trimpath -ldflags='-s -w' -o bin/shrink/shrinkgrow ./bench/shrinkgrow
#   CYCLES=200 bash bench/shrinkgrow.sh shrink:revoke reinit    # on the GPU machine
#
# NCCL 2.30.7 (multi-rank-per-GPU) comes as NCCL_TARBALL, a tar.xz of
# libnccl.so* (bench/multirank_gpu.sh says how it was built). A
# CSV_DIR moves the per-cycle CSVs elsewhere; FALLBACK=1 also runs the
# machine's own NCCL to show the fallback. A configuration is shrink:HOW (HOW: revoke, abort, revoke+abort), reinit or
# reinit-split.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast can take a shared host's GPUs down: never enable it.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
BIN=${BIN:-bin/shrink}
OUT_DIR=${OUT_DIR:-${OUT:-/tmp/shrinkgrow}}
CYCLES=${CYCLES:-200}
RANKS=${RANKS:-4}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
mkdir -p "$OUT_DIR" /tmp/nccl230
tar -xJf "${NCCL_TARBALL:-build/nccl230/nccl.tar.xz}" -C /tmp/nccl230 || exit 2
export GOTRAIN_NCCL_LIBRARY=/tmp/nccl230/libnccl.so.2

{
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nproc
	for lib in /usr/lib/x86_64-linux-gnu/libnccl.so.2 "$GOTRAIN_NCCL_LIBRARY"; do
		[[ -e $lib ]] || continue
		echo "$lib ($(readlink -f "$lib")):"
		nm -D "$lib" | grep -oE 'ncclComm(Shrink|Revoke|Grow|GetUniqueId)$' | sort | tr '\n' ' '
		echo
	done
	# An NCCL without grow (the machine's own, when older than 2.29) falls back to re-init.
	if [[ -n ${FALLBACK:-} && -e /usr/lib/x86_64-linux-gnu/libnccl.so.2 ]]; then
		echo "fallback check with the machine's NCCL:"
		GOTRAIN_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2 timeout -k 5 30 "$BIN"/shrinkgrow -mode shrink -ranks "$RANKS" -cycles 2 -cycle-timeout 10s 2>&1 | tail -n 12
	fi
} >"$OUT_DIR/machine.txt" 2>&1

failed=0
for cfg in "$@"; do
	mode=${cfg%%:*} how=revoke
	[[ $cfg == *:* ]] && how=${cfg#*:}
	name=${cfg//[:+]/-}-$RANKS
	echo "== $name" >&2
	timeout -k 5 "$STEP_TIMEOUT" "$BIN"/shrinkgrow -mode "$mode" -how "$how" -ranks "$RANKS" -cycles "$CYCLES" \
		-cycle-timeout "${CYCLE_TIMEOUT:-20s}" -budget "${BUDGET:-0}" -csv "${CSV_DIR:-$OUT_DIR}/$name.csv" >"$OUT_DIR/$name.log" 2>&1
	rc=$?
	echo "exit $rc" >>"$OUT_DIR/$name.log"
	((rc != 0)) && failed=1
	grep -E '^RESULT|^\| (shrink|grow|reinit|recovery)' "$OUT_DIR/$name.log" >&2
done
exit $failed
