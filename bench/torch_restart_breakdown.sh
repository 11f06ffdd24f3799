#!/usr/bin/env bash
# Where a restarted PyTorch gloo rank's time goes (bench/torch_restart_breakdown.py):
# RUNS restarts of 2 CPU ranks under gotrain launch, with Python standbys
# (--standby=auto) and without (--standby=off), and with GLOO_SOCKET_IFNAME
# set (gloo then skips resolving the hostname), printing each rank's
# timeline after the crash. Also times the hostname's resolution.
#   BIN=bin PYTHON=/usr/bin/python3 RUNS=5 bash bench/torch_restart_breakdown.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-bin}
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-5}
"$PYTHON" -c 'import socket, time
t = time.time(); h = socket.gethostname()
try: a = socket.getaddrinfo(h, None)[0][4][0]
except OSError as e: a = repr(e)
print(f"hostname {h} resolves to {a} in {time.time() - t:.3f} s")'
mark=$(mktemp -u)
for variant in "standby" "nostandby" "standby GLOO_SOCKET_IFNAME=lo"; do
	set -- $variant
	flag=--standby=auto
	[[ $1 == nostandby ]] && flag=--standby=off
	for i in $(seq "$RUNS"); do
		rm -f "$mark"
		env ${2:-} "$BIN/gotrain" launch --nproc-per-node 2 --backend cpu --max-restarts 1 --grace-period 5s $flag -- \
			"$PYTHON" bench/torch_restart_breakdown.py "$mark" 2>/dev/null | grep -o 'BREAKDOWN.*' | sed "s/^/$variant: /"
	done
done
