package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The elastic --nnodes 1:2 job of two one-rank nodes, run again and again
// with the second node joining at different moments (before the first
// starts alone, while it trains, as it finishes), looking for a job that
// printed its final line and then neither ended nor stayed ended: it must
// end (both agents gone) soon after its final line, and never train again
// after it. GOTRAIN_ELASTIC_REPEAT sets the number of runs (default 4; the
// hunt for a rare race used 20 and more).
func TestElasticOneToTwoRepeated(t *testing.T) {
	t.Parallel()
	runs := 4
	if s := os.Getenv("GOTRAIN_ELASTIC_REPEAT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("GOTRAIN_ELASTIC_REPEAT=%q: want a count", s)
		}
		runs = n
	}
	delays := []time.Duration{0, 1500 * time.Millisecond, 3500 * time.Millisecond, 5 * time.Second}
	for i := range runs {
		delay := delays[i%len(delays)]
		flags := []string{"--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "2", "--grace-period", "2s"}
		program := []string{"--", bin.mnist, "--epochs", "2"}
		a := startJob(t, append(append([]string{"launch", "--backend", "cpu", "--node-addr", "127.0.0.1", "--coordinator-listen", "127.0.0.1:0"}, flags...), program...)...)
		join := joinArgs(t, a)
		time.Sleep(delay) // when the second node comes is the variable here, not an assumption about speed
		b := startJob(t, append(append(append([]string{"launch", "--backend", "cpu", "--node-addr", "127.0.0.1"}, join...), flags...), program...)...)
		codeA := a.wait(t, 3*time.Minute)
		codeB := b.wait(t, 3*time.Minute)
		out := a.out.String()
		finals := strings.Count(out, "[rank 0] final test_accuracy=")
		starts := strings.Count(out, "mnist: ") // each start of rank 0's program
		lastFinal := strings.LastIndex(out, "[rank 0] final test_accuracy=")
		trainedAfter := lastFinal >= 0 && strings.Contains(out[lastFinal:], "mnist: ")
		bJoinedLate := codeB != 0 && strings.Contains(b.err.String(), "finished")
		if codeA != 0 || finals != 1 || trainedAfter || (codeB != 0 && !bJoinedLate) {
			t.Errorf("run %d (second node after %s): first node exit %d, second %d, %d final lines, %d starts of rank 0, trained after its final line: %v\n%s",
				i, delay, codeA, codeB, finals, starts, trainedAfter, dump(a, b))
		}
		if t.Failed() {
			return
		}
	}
}
