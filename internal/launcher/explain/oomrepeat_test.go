package explain

import (
	"strings"
	"testing"
)

func TestRepeatedOOM(t *testing.T) {
	const where = "train.py:40 in <module> > train.py:22 in step"
	for _, tc := range []struct {
		name string
		seen []OOMSeen
		oom  OOMSeen
		want string // a part of the answer; "" for none
	}{
		{"first", nil, OOMSeen{Generation: 0, Step: 12, Where: where}, ""},
		{"same step", []OOMSeen{{Generation: 0, Rank: 1, Step: 12, Where: where}}, OOMSeen{Generation: 1, Rank: 1, Step: 12, Where: where},
			"rank 1 ran out of GPU memory in generation 0 and rank 1 in generation 1, both at step 12"},
		{"same step, other frames", []OOMSeen{{Generation: 0, Step: 12, Where: where}}, OOMSeen{Generation: 1, Step: 12, Where: "x.py:1 in f"}, "at step 12"},
		{"other step", []OOMSeen{{Generation: 0, Step: 12, Where: where}}, OOMSeen{Generation: 1, Step: 13, Where: where}, ""},
		{"step unknown, same frames", []OOMSeen{{Generation: 0, Rank: 0, Step: -1, Where: where}}, OOMSeen{Generation: 1, Rank: 3, Step: -1, Where: where},
			"rank 0 ran out of GPU memory in generation 0 and rank 3 in generation 1, both at " + where},
		{"one step unknown, same frames", []OOMSeen{{Generation: 0, Step: 5, Where: where}}, OOMSeen{Generation: 1, Step: -1, Where: where}, "at " + where},
		{"step unknown, other frames", []OOMSeen{{Generation: 0, Step: -1, Where: where}}, OOMSeen{Generation: 1, Step: -1, Where: "x.py:1 in f"}, ""},
		{"no traceback", []OOMSeen{{Generation: 0, Step: -1}}, OOMSeen{Generation: 1, Step: -1}, ""},
		// Two ranks of one generation: one failure, not a repeat.
		{"same generation", []OOMSeen{{Generation: 2, Rank: 0, Step: 7, Where: where}}, OOMSeen{Generation: 2, Rank: 1, Step: 7, Where: where}, ""},
		{"an older one matches", []OOMSeen{{Generation: 0, Step: 3}, {Generation: 1, Step: 9}}, OOMSeen{Generation: 2, Step: 3}, "in generation 0 and rank 0 in generation 2, both at step 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RepeatedOOM(tc.seen, tc.oom)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("RepeatedOOM = %q, want %q", got, tc.want)
			}
		})
	}
}
