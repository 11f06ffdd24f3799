# Turns testprog's TIMING lines (restart mode; unix ns per step) into a
# markdown table of milliseconds after the death, one row per rank; a step a
# rank did not take shows "-". Prefix each input line with "LABEL " to name
# the run (bench/restart_quick.sh and bench/restart.sh do).
#
#   awk -f bench/restart_timing.awk timing.txt
BEGIN {
	n = split("spawn main init ended aborted handed warm_driver warm_ctx warm_comm comm_start driver nccl id ctx boot split comm_ready comm first", cols, " ")
	printf "| run | rank | survivor |"
	for (i = 1; i <= n; i++) printf " %s |", cols[i]
	printf "\n|---|---|---|"
	for (i = 1; i <= n; i++) printf "---|"
	printf "\n"
}
/TIMING/ {
	label = $1
	delete v
	for (i = 1; i <= NF; i++) {
		if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]
	}
	death = v["death"]
	printf "| %s | %s | %s |", label, v["rank"], v["survivor"]
	for (i = 1; i <= n; i++) {
		t = v[cols[i]]
		if (t == "" || t == 0 || death == "") printf " - |"
		else printf " %.0f |", (t - death) / 1e6
	}
	printf "\n"
}
END {
	print ""
	print "Milliseconds after the victim wrote its time of death (negative: before). spawn: process created"
	print "(/proc, 10 ms steps); main; init: worker.Init returned; ended/aborted/handed: a survivor heard the"
	print "generation end, aborted its communicator, got the new generation; warm_driver/warm_ctx: Init's"
	print "prewarm loaded the driver / retained the primary context; warm_comm: a standby's one-rank warm-up"
	print "communicator done (ncclcomm.PrewarmComm); comm_start: NewComm called; driver, nccl:"
	print "loaded; id: unique id in hand; ctx: the comm's thread set up; boot: non-blocking init done; split:"
	print "blocking comm split off; comm_ready: ncclcomm.New returns; comm: worker.NewComm returns; first: first collective of the generation done."
}
