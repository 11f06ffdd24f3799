package worker

import (
	"fmt"
	"strconv"
	"strings"
)

// TuningEnv names the environment variable that holds DataParallel's
// measurement knobs: settings for A/B benchmarks of the GPU path, not for
// training, kept out of DataParallelConfig. A comma-separated list of
//
//	serial-update          AfterReduce on the communication stream, behind its
//	                       bucket's reduction and ahead of the next one's,
//	                       instead of on a stream of its own that overlaps them
//	high-priority-update   that stream of its own at the device's greatest
//	                       priority (on 2 × H200 the step was ~50 µs slower:
//	                       the updates take SMs from the GEMMs they overlap)
//	copy-engine-lanes=N    streams (copy engines) each bucket's copy is split
//	                       over with the copy-engine transport (default 1, the
//	                       fastest measured)
//
// e.g. GOTRAIN_DP_TUNING=serial-update gotrain launch ... NewDataParallel
// reads it; an unknown knob is an error that lists these.
const TuningEnv = "GOTRAIN_DP_TUNING"

// tuning is TuningEnv parsed.
type tuning struct {
	serialUpdate       bool
	highPriorityUpdate bool
	lanes              int // 0: pairreduce.DefaultLanes
}

const tuningKnobs = "serial-update, high-priority-update, copy-engine-lanes=N"

// parseTuning parses TuningEnv's value; "" is no knob.
func parseTuning(s string) (tuning, error) {
	var t tuning
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		name, val, hasVal := strings.Cut(f, "=")
		switch {
		case f == "":
		case f == "serial-update":
			t.serialUpdate = true
		case f == "high-priority-update":
			t.highPriorityUpdate = true
		case name == "copy-engine-lanes" && hasVal:
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return t, fmt.Errorf("worker: DataParallel: %s=%q: copy-engine-lanes=%q: want a whole number, 1 or more", TuningEnv, s, val)
			}
			t.lanes = n
		default:
			return t, fmt.Errorf("worker: DataParallel: %s=%q: unknown knob %q: want a comma-separated list of %s (benchmarks only; unset it to train)", TuningEnv, s, f, tuningKnobs)
		}
	}
	return t, nil
}

func (t tuning) String() string {
	var out []string
	if t.serialUpdate {
		out = append(out, "serial-update")
	}
	if t.highPriorityUpdate {
		out = append(out, "high-priority-update")
	}
	if t.lanes != 0 {
		out = append(out, "copy-engine-lanes="+strconv.Itoa(t.lanes))
	}
	return strings.Join(out, ",")
}
