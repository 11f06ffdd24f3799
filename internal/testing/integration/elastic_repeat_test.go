package integration

import (
	"os"
	"slices"
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
// after it. Two programs: the Go MNIST example and a torch DDP loop on
// gloo. GOTRAIN_ELASTIC_REPEAT sets the number of runs of each (default 4
// and 2; the hunt for a rare race used 20 and more).
func TestElasticOneToTwoRepeated(t *testing.T) {
	t.Parallel()
	runs := func(def int) int {
		s := os.Getenv("GOTRAIN_ELASTIC_REPEAT")
		if s == "" {
			return def
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("GOTRAIN_ELASTIC_REPEAT=%q: want a count", s)
		}
		return n
	}
	t.Run("go", func(t *testing.T) {
		t.Parallel()
		repeatElastic(t, runs(4), startJob, []string{bin.mnist, "--epochs", "2"}, "[rank 0] final test_accuracy=", "mnist: ")
	})
	t.Run("torch", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		start := func(t *testing.T, args ...string) *job { return startTorchJob(t, dir, args...) }
		repeatElastic(t, runs(2), start, []string{"python3", testdata(t, "ddp_train.py")}, "ranks_agree=", "env LOCAL_RANK=0 ")
	})
}

// repeatElastic runs the job n times; final marks the first node's final
// line, started each start of its rank.
func repeatElastic(t *testing.T, n int, start func(*testing.T, ...string) *job, program []string, final, started string) {
	delays := []time.Duration{0, 1500 * time.Millisecond, 3500 * time.Millisecond, 5 * time.Second}
	for i := range n {
		delay := delays[i%len(delays)]
		flags := []string{"launch", "--backend", "cpu", "--node-addr", "127.0.0.1", "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "2", "--grace-period", "2s"}
		a := start(t, slices.Concat(flags, []string{"--coordinator-listen", "127.0.0.1:0", "--"}, program)...)
		join := joinArgs(t, a)
		time.Sleep(delay) // when the second node comes is the variable here, not an assumption about speed
		b := start(t, slices.Concat(flags, join, []string{"--"}, program)...)
		codeA := a.wait(t, 3*time.Minute)
		codeB := b.wait(t, 3*time.Minute)
		out := a.out.String()
		finals := strings.Count(out, final)
		starts := strings.Count(out, started)
		last := strings.LastIndex(out, final)
		trainedAfter := last >= 0 && strings.Contains(out[last:], started)
		bJoinedLate := codeB != 0 && strings.Contains(b.err.String(), "finished")
		if codeA != 0 || finals != 1 || trainedAfter || (codeB != 0 && !bJoinedLate) {
			t.Errorf("run %d (second node after %s): first node exit %d, second %d, %d final lines, %d starts of rank 0, trained after its final line: %v\n%s",
				i, delay, codeA, codeB, finals, starts, trainedAfter, dump(a, b))
			return
		}
	}
}
