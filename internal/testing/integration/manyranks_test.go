package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// manyRanks is more ranks on one node than any fixed queue of the agent's
// would hold: a big CPU node under --nproc-per-node cpu has this many.
const manyRanks = 1000

// TestManyRanksExitTogether: a thousand ranks that end at once are every one
// reported, so that the job ends — with rc 0 when they succeed, and with one
// failure report, the right one, when they all fail.
func TestManyRanksExitTogether(t *testing.T) {
	t.Run("succeed", func(t *testing.T) {
		r := launch(t, 5*time.Minute, "launch", "--nproc-per-node", "1000", "--backend", "cpu", "--standby", "off", "--", "true")
		if r.code != 0 {
			t.Fatalf("%d ranks of true: exit %d, want 0\nstderr:\n%s", manyRanks, r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "dropping") {
			t.Errorf("a report was dropped:\n%s", r.stderr)
		}
	})

	// Every rank opens a FIFO the test holds open for writing, says it is
	// ready, and waits for end of file: the test's close releases all the
	// ranks at once, and each exits 3.
	t.Run("fail together", func(t *testing.T) {
		dir := t.TempDir()
		fifo := filepath.Join(dir, "go")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		// O_RDWR: opening does not wait for a reader, and the ranks' opens
		// do not wait for a writer while the test holds it.
		hold, err := os.OpenFile(fifo, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Close()
		ready := filepath.Join(dir, "ready")
		if err := os.Mkdir(ready, 0o700); err != nil {
			t.Fatal(err)
		}
		// Release the ranks once all are ready; a launch that ends first
		// (a failure) makes the release moot.
		released, ended := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(released)
			for {
				select {
				case <-ended:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if entries, _ := os.ReadDir(ready); len(entries) == manyRanks {
					hold.Close()
					return
				}
			}
		}()
		r := launch(t, 5*time.Minute, "launch", "--nproc-per-node", "1000", "--backend", "cpu", "--standby", "off",
			"--max-restarts", "0", "--", "sh", "-c", `exec 3<"$0"; : > "$1/$RANK"; cat <&3 >/dev/null; exit 3`, fifo, ready)
		close(ended)
		<-released
		if r.code != 3 {
			t.Fatalf("%d ranks exiting 3: exit %d, want 3\nstderr:\n%s", manyRanks, r.code, r.stderr)
		}
		if n := strings.Count(r.stderr, "gotrain: job failed:"); n != 1 {
			t.Errorf("%d \"job failed\" lines, want 1:\n%s", n, r.stderr)
		}
		if !strings.Contains(r.stderr, "exit status 3") || strings.Contains(r.stderr, "dropping") {
			t.Errorf("want the failure named as exit status 3 and no report dropped:\n%s", r.stderr)
		}
	})
}
