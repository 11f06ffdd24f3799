package job

import (
	"testing"
	"time"
)

// The pause for a failure that repeats before any progress doubles from the
// second repeat and stops growing at RepeatBackoffMax.
func TestRepeatBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 1: 0, 2: time.Second, 3: 2 * time.Second, 4: 4 * time.Second,
		6: 16 * time.Second, 7: RepeatBackoffMax, 60: RepeatBackoffMax, 1 << 20: RepeatBackoffMax} {
		if got := repeatBackoff(n); got != want {
			t.Errorf("repeatBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}
