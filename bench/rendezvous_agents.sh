#!/usr/bin/env bash
# Rendezvous of real agents on this machine: NODES
# `gotrain launch --nproc-per-node 1 --backend cpu` agents on loopback, the
# first embedding the coordinator, each running one worker that records when
# it started and sleeps 5 s. For each run it prints the time from the last
# agent's start to every worker running, the embedding agent's RSS and a
# plain agent's (median), each agent's exit codes, and from the coordinator's
# log: nodes lost (with every agent alive, a false death) and nodes found
# unreachable (suspected, e.g. by gossip, then reachable again: no restart).
# KEEP=1 keeps each run's logs and prints where.
#
#   go build -o /tmp/x/gotrain ./cmd/gotrain
#   GOTRAIN=/tmp/x/gotrain NODES="32 64" RUNS=2 bash bench/rendezvous_agents.sh
#
# EXTRA adds flags to every agent (e.g. EXTRA=--no-gossip). Every agent runs
# on 127.0.0.1, so they all connect from one address: the coordinator admits
# at most internal/coordinator/host.MaxConnsPerIP (64) connections from one address.
set -uo pipefail
GOTRAIN=${GOTRAIN:-/tmp/x/gotrain}
NODES=${NODES:-"32 64"}
RUNS=${RUNS:-2}
EXTRA=${EXTRA:-}
PORT=${PORT:-29731}
TIMEOUT=${TIMEOUT:-120}

now() { date +%s.%N; }

echo "| agents | run | last start -> all running (s) | workers running | exit codes | coordinator agent RSS (MiB) | other agent RSS, median (MiB) | nodes lost | unreachable, then back | connections refused |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in $NODES; do
	for run in $(seq "$RUNS"); do
		dir=$(mktemp -d /tmp/gotrain-rdv-XXXX)
		tok=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
		export GOTRAIN_JOB_TOKEN=$tok
		work=(-- sh -c "date +%s.%N >>$dir/started; exec sleep 5")
		pids=()
		"$GOTRAIN" launch --nproc-per-node 1 --backend cpu --nnodes "$n" --node-addr 127.0.0.1 \
			--coordinator-listen "127.0.0.1:$PORT" --rendezvous-timeout "${TIMEOUT}s" --verbose $EXTRA "${work[@]}" >"$dir/a0.out" 2>"$dir/a0.err" &
		pids+=($!)
		# Since the control plane is TLS (1b7d2d9) the others pin the job CA
		# by the --ca-hash that the first node's join hint prints.
		pin=()
		# Up to 60 s: on a loaded machine the first node can be slow to print it,
		# and joiners started without the pin are refused.
		for _ in $(seq 600); do
			h=$(grep -o -- '--ca-hash [^ ]*' "$dir/a0.err" | head -1)
			[ -n "$h" ] && pin=($h) && break
			grep -q -- '--coordinator ' "$dir/a0.err" && break # a gotrain without TLS
			sleep 0.1
		done
		for i in $(seq 1 $((n - 1))); do
			"$GOTRAIN" launch --nproc-per-node 1 --backend cpu --nnodes "$n" --node-addr 127.0.0.1 \
				--coordinator "127.0.0.1:$PORT" "${pin[@]}" --join-timeout "${TIMEOUT}s" $EXTRA "${work[@]}" >"$dir/a$i.out" 2>"$dir/a$i.err" &
			pids+=($!)
		done
		last=$(now) # the first agent's start up to its hint is not counted
		# Wait for every worker to start (or TIMEOUT), then sample RSS.
		deadline=$(($(date +%s) + TIMEOUT))
		count() { cat "$dir/started" 2>/dev/null | wc -l; }
		while [ "$(count)" -lt "$n" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.05; done
		started=$(count)
		rss0=$(awk '/^VmRSS/{printf "%.1f", $2/1024}' "/proc/${pids[0]}/status" 2>/dev/null)
		rssm=$(for p in "${pids[@]:1}"; do awk '/^VmRSS/{print $2/1024}' "/proc/$p/status" 2>/dev/null; done | sort -n | awk '{a[NR]=$1} END{if(NR) printf "%.1f", a[int((NR+1)/2)]}')
		codes=()
		for p in "${pids[@]}"; do
			wait "$p"
			codes+=($?)
		done
		if [ "$started" -gt 0 ]; then
			allrun=$(sort -n "$dir/started" | tail -1 | awk -v l="$last" '{printf "%.2f", $1-l}')
		else
			allrun=-
		fi
		exits=$(printf '%s\n' "${codes[@]}" | sort | uniq -c | awk '{printf "%s×%s ", $1, $2}')
		lost=$(grep -c 'msg="node lost"' "$dir/a0.err")
		unreach=$(grep -c 'msg="node unreachable"' "$dir/a0.err")
		back=$(grep -c 'msg="node reachable again"' "$dir/a0.err")
		refused=$(grep -o ' refused=[0-9]*' "$dir/a0.err" | awk -F= '{s+=$2} END{print s+0}')
		echo "| $n | $run | $allrun | $started of $n | $exits| $rss0 | $rssm | $lost | $unreach, $back | $refused |"
		grep -h '^gotrain: job failed' "$dir"/a*.err 2>/dev/null | cut -c1-300 | sort | uniq -c | sort -rn | head -3 >&2
		[ "${KEEP:-0}" = 1 ] && echo "logs: $dir" >&2 || rm -rf "$dir"
	done
done
