package k8stest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// A PyTorch rank crash in a two-pod JobSet (one gloo rank a pod), crash →
// the restarted group's first all-reduce, two ways on the same harness:
//
//   - in-pod: gotrain (PID 1, no flags) restarts the ranks inside the pods
//     (a Python standby takes over), the pods never restart;
//   - container-restart: gotrain --max-restarts 0, so the job fails and
//     every pod's container exits 1; the harness starts each container
//     again at once, as the kubelet's restartPolicy OnFailure does, but
//     with no CrashLoopBackOff delay (the kubelet's first is 10 s, then 20,
//     40, … up to 300 s: add it to these figures).
//
// Five crashes each; the figures are the slowest rank's, in ms:
//
//	go test -run '^$' -bench CrashToFirstCollective -benchtime 1x ./internal/testing/k8stest
func BenchmarkCrashToFirstCollective(b *testing.B) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		b.Skip("no /usr/bin/python3 (with torch): apt-get install python3-torch")
	}
	for _, mode := range []string{"in-pod", "container-restart"} {
		b.Run(mode, func(b *testing.B) {
			var ms []float64
			for run := range 5 {
				s := crashOnce(b, py, mode == "container-restart")
				b.Logf("%s run %d: %.0f ms", mode, run+1, s*1000)
				ms = append(ms, s*1000)
			}
			slices.Sort(ms)
			b.ReportMetric(ms[0], "min-ms")
			b.ReportMetric(ms[len(ms)/2], "median-ms")
			b.ReportMetric(ms[len(ms)-1], "max-ms")
		})
	}
}

// recoveryProgram all-reduces once; without the mark file, the last rank
// writes the crash time into it CRASH_AFTER s later and exits 1; with it,
// each rank prints how long after the crash its first all-reduce ended.
const recoveryProgram = `import os, sys, time
import torch, torch.distributed as dist
mark = sys.argv[1]
dist.init_process_group("gloo")
x = torch.ones(1 << 16)
dist.all_reduce(x)
if os.path.exists(mark):
    print("RECOVERED rank=%d in=%.3f" % (dist.get_rank(), time.time() - float(open(mark).read())), flush=True)
    dist.destroy_process_group()
    sys.exit(0)
if dist.get_rank() == dist.get_world_size() - 1:
    time.sleep(float(os.environ.get("CRASH_AFTER", "6")))
    with open(mark + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(mark + ".tmp", mark)
    os._exit(1)
dist.all_reduce(x)
time.sleep(600)
`

var recovered = regexp.MustCompile(`RECOVERED rank=\d+ in=([0-9.]+)`)

// crashOnce runs the two-pod job until one crash is recovered and returns
// the slowest rank's seconds from the crash to its first all-reduce.
func crashOnce(b *testing.B, py string, restartContainers bool) float64 {
	b.Helper()
	dir := b.TempDir()
	prog, mark := filepath.Join(dir, "recover.py"), filepath.Join(dir, "mark")
	if err := os.WriteFile(prog, []byte(recoveryProgram), 0o644); err != nil {
		b.Fatal(err)
	}
	js := newJobSet(b, 2, "PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PATH=/usr/bin:/bin:/usr/sbin:/sbin")
	args := []string{bin.gotrain, "launch", "--", py, prog, mark}
	if restartContainers {
		args = []string{bin.gotrain, "launch", "--max-restarts", "0", "--", py, prog, mark}
	}
	for i := range 2 {
		js.start(i, args...)
	}
	if restartContainers {
		// The kubelet: a container that exits non-zero starts again.
		for i, p := range js.pods {
			if code := js.wait(p, 3*time.Minute); code == 0 {
				b.Fatalf("pod %d exited 0 before the crash:\n%s", i, js.out())
			}
		}
		for i := range 2 {
			js.start(i, args...)
		}
	}
	var worst float64
	for i, p := range js.pods {
		if code := js.wait(p, 3*time.Minute); code != 0 {
			b.Fatalf("pod %d exited %d after the recovery:\n%s", i, code, js.out())
		}
		m := recovered.FindAllStringSubmatch(p.p.Stdout(), -1)
		if len(m) != 1 {
			b.Fatalf("pod %d: want one RECOVERED line:\n%s", i, js.out())
		}
		s, _ := strconv.ParseFloat(m[0][1], 64)
		worst = max(worst, s)
	}
	return worst
}
