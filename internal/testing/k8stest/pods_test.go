// Package k8stest runs gotrain in "pods" as a kubelet would start them,
// with no Kubernetes control plane: each pod is a network namespace
// (internal/testing/vcluster) with its own UTS, mount and PID namespaces, its
// hostname, the variables the Job and JobSet controllers set, and an
// /etc/hosts that stands for the headless Service's DNS records
// (internal/testing/podsim). The same pods on a real API server, Job controller
// and a test kubelet: the e2e module below (`make e2e-kubernetes`). The
// container's entrypoint, gotrain, is PID 1 of its pod. A pod's deletion
// is SIGTERM to that PID 1 (then SIGKILL after the grace period), a lost
// node SIGKILL of the whole pod.
//
// It needs root, ip and unshare; without them it skips, saying why (with
// $CI set it fails).
package k8stest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/podsim"
	"github.com/gotrain/gotrain/internal/testing/testbin"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

var bin struct{ gotrain, mnist, data string }

func TestMain(m *testing.M) {
	pkgs := []string{"./cmd/gotrain", "./examples/mnist"}
	testbin.Main(m, "gotrain-k8stest-", pkgs, func(dir string, built map[string]string) (err error) {
		bin.gotrain, bin.mnist = built[pkgs[0]], built[pkgs[1]]
		bin.data, err = testbin.MNISTData()
		return err
	})
}

// jobSet is a JobSet "train" of one replicated job "workers" of n pods
// (train-workers-0-0 …), its headless Service "train".
type jobSet struct {
	t     testing.TB
	vc    *vcluster.Cluster
	dir   string
	hosts string // the /etc/hosts every pod sees
	env   []string
	pods  []*pod
}

type pod struct {
	name string
	h    *vcluster.Host
	p    *vcluster.Proc
}

const (
	jobSetName = "train"
	rjob       = "workers"
	token      = "4f0c2a9d7e1b3c5a6f8e0d2b4a6c8e0f"
)

func podName(i int) string { return fmt.Sprintf("%s-%s-0-%d", jobSetName, rjob, i) }

// newJobSet makes the pods' hosts and the Service records; env is every
// pod's template env (the JobSet's, besides what the controllers add).
func newJobSet(t testing.TB, n int, env ...string) *jobSet {
	t.Helper()
	for _, tool := range []string{"ip", "unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("k8stest: %s not found (CI is set: this test must run)", tool)
			}
			t.Skipf("k8stest: %s not found", tool)
		}
	}
	js := &jobSet{t: t, vc: vcluster.New(t, n, vcluster.Options{}), dir: t.TempDir(), env: env}
	// The headless Service's records, as cluster DNS would answer them,
	// and the kubelet's own lines.
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
	for i, h := range js.vc.Hosts {
		name := podName(i)
		fmt.Fprintf(&b, "%s\t%s.%s.default.svc.cluster.local\t%s.%s\t%s\n", h.IP, name, jobSetName, name, jobSetName, name)
	}
	js.hosts = filepath.Join(js.dir, "hosts")
	if err := os.WriteFile(js.hosts, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	js.pods = make([]*pod, n)
	return js
}

// start starts pod i (again, as a replacement does: same name and index)
// with the container command args.
func (js *jobSet) start(i int, args ...string) *pod {
	js.t.Helper()
	name := podName(i)
	// A container's own /tmp: pods share this machine's, and the agents'
	// pids (PID namespaces of their own) coincide.
	// (Short: the workers' socket path must fit in 108 bytes.)
	tmp, err := os.MkdirTemp("", "gtk8s-")
	if err != nil {
		js.t.Fatal(err)
	}
	js.t.Cleanup(func() { os.RemoveAll(tmp) })
	env := append([]string{
		"TMPDIR=" + tmp,
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", // the kubelet's
		"HOSTNAME=" + name,
		"JOB_COMPLETION_INDEX=" + strconv.Itoa(i), // the Job controller's
		"GOTRAIN_JOB_TOKEN=" + token,              // secretKeyRef
		"GOTRAIN_RESTART_ATTEMPT=0",               // downward API of jobset.sigs.k8s.io/restart-attempt
		"GOTRAIN_SLURM=off",
	}, js.env...)
	p := &pod{name: name, h: js.vc.Hosts[i], p: podsim.Start(js.vc.Hosts[i], podsim.Pod{Hostname: name, HostsFile: js.hosts, Env: env, Argv: args})}
	js.pods[i] = p
	return p
}

// pid1 is the host pid of the pod's PID 1.
func (p *pod) pid1(t testing.TB) int {
	t.Helper()
	pid, err := podsim.PID1(p.p, time.Minute)
	if err != nil {
		t.Fatalf("pod %s: %v", p.name, err)
	}
	return pid
}

// procs are the host pids of the pod's processes that run program.
func (p *pod) procs(program string) []int { return podsim.Procs(p.h, program) }

func (js *jobSet) out() string {
	var b strings.Builder
	for _, p := range js.pods {
		if p != nil {
			fmt.Fprintf(&b, "=== pod %s stdout:\n%s=== stderr:\n%s", p.name, p.p.Stdout(), p.p.Stderr())
		}
	}
	return b.String()
}

// waitOut waits until the pod's output (stdout and stderr) matches re.
func (js *jobSet) waitOut(p *pod, re *regexp.Regexp, d time.Duration) {
	js.t.Helper()
	for deadline := time.Now().Add(d); !re.MatchString(p.p.Stdout() + p.p.Stderr()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			js.t.Fatalf("pod %s: no %q within %s:\n%s", p.name, re, d, js.out())
		}
	}
}

func (js *jobSet) wait(p *pod, d time.Duration) int {
	js.t.Helper()
	code, err := p.p.Wait(d)
	if err != nil {
		js.t.Fatalf("pod %s: %v:\n%s", p.name, err, js.out())
	}
	return code
}

var final = regexp.MustCompile(`(?m)^\[rank 0\] final test_accuracy=[0-9.]+ ranks_agree=true$`)

// The container command is `gotrain launch -- PROGRAM`: no gotrain flag.
func mnist(args ...string) []string {
	return append([]string{bin.gotrain, "launch", "--", bin.mnist, "--data", bin.data}, args...)
}

// Three pods × two CPU ranks train MNIST with no gotrain flags: the pods'
// variables give the node count, ranks and coordinator (pod 0-0, by its
// Service name), PET_NPROC_PER_NODE the ranks per pod.
func TestJobSetTrains(t *testing.T) {
	js := newJobSet(t, 3, "PET_NNODES=3", "PET_NPROC_PER_NODE=2")
	for i := range 3 {
		js.start(i, mnist("--epochs", "1", "--limit", "3000")...)
	}
	for i, p := range js.pods {
		if code := js.wait(p, 3*time.Minute); code != 0 {
			t.Fatalf("pod %d exited %d:\n%s", i, code, js.out())
		}
	}
	o := js.pods[0].p.Stdout() + js.pods[0].p.Stderr()
	if !final.MatchString(o) || !strings.Contains(o, "[rank 0] mnist: 6 ranks,") {
		t.Fatalf("no 6-rank ranks_agree=true from pod 0:\n%s", js.out())
	}
	if strings.Contains(js.out(), token) {
		t.Errorf("the job token shows in the output:\n%s", js.out())
	}
}

// A worker crash is recovered inside the pod: the rank's process starts
// again (worker.Run recovers in process), the pod's PID 1 never exits,
// and the job ends trained.
func TestWorkerCrashRecoversInPod(t *testing.T) {
	js := newJobSet(t, 3, "PET_NNODES=3", "PET_NPROC_PER_NODE=2")
	for i := range 3 {
		js.start(i, mnist("--epochs", "2", "--limit", "6000")...)
	}
	js.waitOut(js.pods[0], regexp.MustCompile(`\[rank 0\] epoch=1 `), 3*time.Minute)
	pid1 := js.pods[1].pid1(t)
	victims := js.pods[1].procs(bin.mnist)
	if len(victims) == 0 {
		t.Fatalf("pod 1 runs no mnist process:\n%s", js.out())
	}
	if err := syscall.Kill(victims[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, p := range js.pods {
		if code := js.wait(p, 3*time.Minute); code != 0 {
			t.Fatalf("pod %d exited %d after a worker crash; want the job recovered in the pod:\n%s", i, code, js.out())
		}
	}
	if !final.MatchString(js.pods[0].p.Stdout()) {
		t.Fatalf("no ranks_agree=true after the crash:\n%s", js.out())
	}
	// Every pod names the killed rank, not a peer whose collective failed
	// first (internal/coordinator/job blameKilled).
	killed := regexp.MustCompile(`gotrain: rank [23] on ` + podName(1) + ` was killed by SIGKILL\b.*: restarting all 6 ranks`)
	for _, p := range js.pods {
		if !killed.MatchString(p.p.Stderr()) {
			t.Errorf("pod %s does not name the killed worker (%s):\n%s", p.name, killed, js.out())
		}
	}
	_ = pid1 // the same PID 1 ran to the end: the pod process above exited 0 once
}

// A pod lost under PET_NNODES=2:3: the survivors train on, the replacement
// (same name and index, as JobSet or the Job controller recreates it)
// rejoins, and a SIGTERM to every pod's PID 1 (deletion) stops every
// worker within the grace period.
func TestPodLostAndReplacedUnderMinMax(t *testing.T) {
	js := newJobSet(t, 3, "PET_NNODES=2:3", "PET_NPROC_PER_NODE=1")
	prog := []string{bin.gotrain, "launch", "--", "sh", "-c",
		`trap 'echo "got TERM on $(hostname)"; exit 143' TERM; echo "start world=$WORLD_SIZE restart=$GOTRAIN_RESTART_COUNT on $(hostname)"; while :; do sleep 0.1; done`}
	for i := range 3 {
		js.start(i, prog...)
	}
	for _, p := range js.pods {
		js.waitOut(p, regexp.MustCompile(`start world=3 `), 3*time.Minute)
	}
	t0 := time.Now()
	js.pods[2].h.Kill() // the node is gone: SIGKILL to the whole pod
	for _, p := range js.pods[:2] {
		js.waitOut(p, regexp.MustCompile(`start world=2 restart=[1-9]`), 3*time.Minute)
	}
	t.Logf("pod 2 killed to the survivors training again: %s", time.Since(t0).Round(10*time.Millisecond))

	js.start(2, prog...) // the replacement
	for _, p := range js.pods[:2] {
		js.waitOut(p, regexp.MustCompile(`(?s)start world=2 .*start world=3 restart=\d+ on `+p.name), 3*time.Minute)
	}
	js.waitOut(js.pods[2], regexp.MustCompile(`start world=3 restart=\d+ on `+podName(2)), time.Minute)

	// Deletion: SIGTERM to each PID 1; gotrain's grace period (10 s) fits
	// in terminationGracePeriodSeconds (30 s by default).
	for _, p := range js.pods {
		if err := syscall.Kill(p.pid1(t), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range js.pods {
		code := js.wait(p, 30*time.Second)
		if code != 143 || !strings.Contains(p.p.Stdout(), "got TERM on "+p.name) {
			t.Errorf("pod %s exited %d; want 143 with its worker stopped by SIGTERM:\n%s", p.name, code, js.out())
		}
	}
}
