package worker

import (
	"strings"
	"testing"
)

func TestParseTuning(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want tuning
		err  string
	}{
		{"", tuning{}, ""},
		{"serial-update", tuning{serialUpdate: true}, ""},
		{" high-priority-update , copy-engine-lanes=3 ", tuning{highPriorityUpdate: true, lanes: 3}, ""},
		{"serial-update,,", tuning{serialUpdate: true}, ""},
		{"copy-engine-lanes=0", tuning{}, "want a whole number, 1 or more"},
		{"copy-engine-lanes=x", tuning{}, "want a whole number, 1 or more"},
		{"copy-engine-lanes", tuning{}, "unknown knob"},
		{"serial", tuning{}, "unknown knob \"serial\": want a comma-separated list of serial-update, high-priority-update, copy-engine-lanes=N"},
	} {
		got, err := parseTuning(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), TuningEnv) {
				t.Errorf("parseTuning(%q) = %v, want an error naming %s with %q", tc.in, err, TuningEnv, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseTuning(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if again, err := parseTuning(got.String()); err != nil || again != got {
			t.Errorf("parseTuning(%q.String() = %q) = %+v, %v", tc.in, got.String(), again, err)
		}
	}
}

// NewDataParallel refuses a tuning it does not know before it touches the
// communicator, and names the variable.
func TestNewDataParallelBadTuning(t *testing.T) {
	t.Setenv(TuningEnv, "turbo")
	_, err := NewDataParallel(t.Context(), nil, []int{4}, Host(make([]float32, 4)), DataParallelConfig{})
	if err == nil || !strings.Contains(err.Error(), TuningEnv) || !strings.Contains(err.Error(), `"turbo"`) {
		t.Fatalf("NewDataParallel with %s=turbo: %v", TuningEnv, err)
	}
}
