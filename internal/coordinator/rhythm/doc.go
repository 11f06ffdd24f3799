// Package rhythm learns a training job's rhythm from its ranks' progress
// samples and decides two things from it: how long a collective may wait
// before it counts as hung (the adaptive hang timeout, [Pace]), and which
// rank, if any, the others keep waiting for (the straggler, [Judge]).
//
// It is pure: every sample carries its time, nothing reads the clock, and
// nothing here does I/O. The job machine (internal/coordinator/job) feeds it on each
// tick and turns its answers into verdicts.
//
// # The adaptive hang timeout
//
// A [Pace] watches one communicator's lowest completed collective seq: each
// time it moves, the time from its previous completion to the moment the
// caller saw it move is one interval (so report delays count too). Intervals of
// the warm-up (those starting before seq Warmup of a generation: connection
// set-up, first-step compilation) are left out. Once MinIntervals are in,
// the timeout is
//
//	max(Multiplier × p99(intervals), Floor)    default max(3 × p99, 1s)
//
// over the last Window intervals. The interval is measured between the moves
// the detector sees (the workers' completion times, sampled about once a
// second), so one interval may span several collectives: it is never shorter
// than the longest gap between two completions inside it, which keeps the
// timeout on the safe side. Before it has enough intervals the caller uses
// its fixed fallback.
//
// # The straggler
//
// In a data-parallel job every rank completes each collective at about the
// same moment (the collective synchronises them), so step rates are equal;
// what differs is how a rank spends the time between two completions: its
// own compute, and waiting inside the collective for the last rank to arrive.
// For each rank, between two samples taken at its completions,
//
//	compute per collective = (Δ completion time − Δ wait) / Δ seq
//
// A [Judge] compares each rank's compute per collective over a sliding
// window with the median of the others'. When one rank's is more than
// Slower (default 20 %) and MinExtra (default 10ms) above it on Streak
// consecutive judgements, that rank is named: "its steps are X % slower".
// When workers also send the waits of their recent collectives, the judge
// counts at how many common collectives the rank waited least, that is,
// arrived last ("it arrives last at Y % of collectives"). The finding is
// withdrawn when the rank's excess falls below half the threshold.
package rhythm
