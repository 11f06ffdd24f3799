package worker

import (
	"strings"
	"testing"
)

// Each knob parses, alone or with others, and String gives back a value
// that parses to the same knobs.
func TestParseTuning(t *testing.T) {
	good := map[string]tuning{
		"":                    {},
		"serial-update":       {serialUpdate: true},
		"serial-update,,":     {serialUpdate: true},
		"copy-engine-lanes=3": {lanes: 3},
		" high-priority-update , copy-engine-lanes=2 ": {highPriorityUpdate: true, lanes: 2},
	}
	for in, want := range good {
		got, err := parseTuning(in)
		if err != nil || got != want {
			t.Errorf("parseTuning(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := parseTuning(got.String()); err != nil || again != got {
			t.Errorf("parseTuning(%q) after String %q = %+v, %v", in, got.String(), again, err)
		}
	}
}

// A knob it does not know, or a lane count that is not one, is an error
// that names the variable and says what it takes.
func TestParseTuningRefuses(t *testing.T) {
	bad := map[string]string{
		"copy-engine-lanes=0": "want a whole number, 1 or more",
		"copy-engine-lanes=x": "want a whole number, 1 or more",
		"copy-engine-lanes":   "unknown knob",
		"serial":              `unknown knob "serial": want a comma-separated list of serial-update, high-priority-update, copy-engine-lanes=N`,
	}
	for in, why := range bad {
		_, err := parseTuning(in)
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), TuningEnv) {
			t.Errorf("parseTuning(%q) = %v, want an error naming %s with %q", in, err, TuningEnv, why)
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
