// Package e2e runs gotrain on a real Kubernetes control plane: etcd,
// kube-apiserver and kube-controller-manager (its Job controller), built
// from their Go modules (the controlplane and etcd modules below), with a
// test kubelet of ours that runs each pod the Job controller creates as
// processes in a network namespace (internal/testing/podsim). The manifests are an
// Indexed Job with a headless Service and the job token in a Secret, as in
// examples/kubernetes/indexed-job.yaml; the container command has no
// gotrain flag.
//
// It is a module of its own, so that the main module's build (and CI's)
// never downloads client-go; the API server takes minutes to build, so CI
// does not run it (bench/results/kube-apiserver-build-2026-12-03.md):
//
//	make e2e-kubernetes
//
// which builds the binaries into build/k8s-e2e and runs
// `go test` here with GOTRAIN_E2E_BIN set. Without it the tests skip.
// It needs root, ip and unshare (internal/testing/vcluster).
//
// JobSet is not covered: its module (sigs.k8s.io/jobset) is not served to
// this project; JobSet's pods are an Indexed Job's, which is what runs here.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

var (
	// bin is the directory of gotrain, mnist and the control plane's
	// binaries; data the MNIST files'.
	bin, data string
	cp        *controlPlane
	skip      string // why the tests cannot run here
)

func TestMain(m *testing.M) {
	bin, data = os.Getenv("GOTRAIN_E2E_BIN"), os.Getenv("GOTRAIN_E2E_MNIST")
	if bin == "" || data == "" {
		skip = "GOTRAIN_E2E_BIN and GOTRAIN_E2E_MNIST are not set: run make e2e-kubernetes"
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "gotrain-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t0 := time.Now()
	if cp, err = startControlPlane(bin, dir); err != nil {
		fmt.Fprintln(os.Stderr, "control plane:", err)
		os.Exit(1)
	}
	fmt.Printf("control plane ready in %s (etcd, kube-apiserver, kube-controller-manager; logs in %s)\n", time.Since(t0).Round(10*time.Millisecond), dir)
	code := m.Run()
	cp.stop()
	if code == 0 {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// job is a test's Indexed Job "name" of n pods: its headless Service and
// token Secret, and a kubelet that runs its pods.
type job struct {
	t    *testing.T
	name string
	k    *kubelet
	tok  string
}

// newJob creates the Service, the Secret and the Job (PET_* in env, the
// container command argv) and starts a kubelet with room for n pods plus a
// replacement.
func newJob(t *testing.T, name string, n int32, env map[string]string, argv ...string) *job {
	t.Helper()
	if skip != "" {
		t.Skip(skip)
	}
	ctx := context.Background()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	j := &job{t: t, name: name, tok: hex.EncodeToString(b)}
	j.k = newKubelet(t, cp.client, "default", "batch.kubernetes.io/job-name="+name, int(n)+1)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-token"}, Data: map[string][]byte{"token": []byte(j.tok)}}
	svc, jb := exampleManifests(t)
	// The example's objects, renamed for this test, with the test's
	// command and env.
	svc.Name, svc.Spec.Selector = name, map[string]string{"batch.kubernetes.io/job-name": name}
	jb.Name = name
	spec := &jb.Spec
	spec.Completions, spec.Parallelism = &n, &n
	pod := &spec.Template.Spec
	pod.Subdomain = name
	// No API token in the pods (gotrain needs none; this kubelet mounts
	// Secret volumes only).
	pod.AutomountServiceAccountToken = ptr.To(false)
	if len(pod.Containers) != 1 || len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil {
		t.Fatalf("%s: want one container and one Secret volume (the token's)", exampleJob)
	}
	pod.Volumes[0].Secret.SecretName = secret.Name
	c := &pod.Containers[0]
	c.Command, c.Args, c.Env = argv, nil, nil
	for k, v := range env {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
	}
	if _, err := cp.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.client.CoreV1().Secrets("default").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.client.BatchV1().Jobs("default").Create(ctx, jb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		_ = cp.client.BatchV1().Jobs("default").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
		_ = cp.client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.client.CoreV1().Secrets("default").Delete(ctx, name+"-token", metav1.DeleteOptions{})
	})
	return j
}

// exampleJob holds the manifests the tests run: what a user copies.
const exampleJob = "../../../../examples/kubernetes/indexed-job.yaml"

// exampleManifests decodes exampleJob's Service and Job.
func exampleManifests(t *testing.T) (*corev1.Service, *batchv1.Job) {
	t.Helper()
	b, err := os.ReadFile(exampleJob)
	if err != nil {
		t.Fatal(err)
	}
	var svc *corev1.Service
	var jb *batchv1.Job
	for _, doc := range strings.Split(string(b), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", exampleJob, err)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			svc = o
		case *batchv1.Job:
			jb = o
		default:
			t.Fatalf("%s: unexpected %T", exampleJob, obj)
		}
	}
	if svc == nil || jb == nil {
		t.Fatalf("%s: want a Service and a Job", exampleJob)
	}
	return svc, jb
}

// waitCondition waits until the Job has condition typ (Complete, Failed)
// and returns the Job.
func (j *job) waitCondition(typ batchv1.JobConditionType, d time.Duration) *batchv1.Job {
	j.t.Helper()
	var last *batchv1.Job
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got, err := cp.client.BatchV1().Jobs("default").Get(context.Background(), j.name, metav1.GetOptions{})
		if err != nil {
			j.t.Fatal(err)
		}
		last = got
		for _, c := range got.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			if c.Type == typ {
				return got
			}
			if c.Type == batchv1.JobFailed || c.Type == batchv1.JobComplete {
				j.t.Fatalf("job %s: %s (%s: %s), want %s:\n%s", j.name, c.Type, c.Reason, c.Message, typ, j.k.logs())
			}
		}
	}
	j.t.Fatalf("job %s: no %s within %s (status %+v):\n%s", j.name, typ, d, last.Status, j.k.logs())
	return nil
}

// mnist is the container command: `gotrain launch -- mnist …`, no gotrain
// flag.
func mnist(args ...string) []string {
	return append([]string{filepath.Join(bin, "gotrain"), "launch", "--", filepath.Join(bin, "mnist"), "--data", data}, args...)
}

var final = regexp.MustCompile(`(?m)^\[rank 0\] final test_accuracy=[0-9.]+ ranks_agree=true$`)

// An Indexed Job of 3 pods × 2 CPU ranks trains MNIST with no gotrain
// flag: the Job controller's JOB_COMPLETION_INDEX and hostnames, the
// Service's records, PET_NNODES and PET_NPROC_PER_NODE give the job; the
// token comes from the Secret volume. Every pod Succeeds and the Job
// Completes.
func TestIndexedJobTrains(t *testing.T) {
	j := newJob(t, "mnist", 3, map[string]string{"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2"},
		mnist("--epochs", "1", "--limit", "3000")...)
	got := j.waitCondition(batchv1.JobComplete, 5*time.Minute)
	if got.Status.Succeeded != 3 || got.Status.Failed != 0 {
		t.Errorf("job status succeeded %d failed %d, want 3 and 0", got.Status.Succeeded, got.Status.Failed)
	}
	o := j.k.latest(0, 0).output()
	if !final.MatchString(o) || !strings.Contains(o, "[rank 0] mnist: 6 ranks,") {
		t.Fatalf("no 6-rank ranks_agree=true from pod 0:\n%s", j.k.logs())
	}
	if strings.Contains(j.k.logs(), j.tok) {
		t.Errorf("the job token shows in the output:\n%s", j.k.logs())
	}
}

// A worker crash is recovered inside its pod: the Job controller sees no
// failed pod and makes no replacement; the Job Completes with 3 pods.
func TestWorkerCrashRecoversInPod(t *testing.T) {
	j := newJob(t, "crash", 3, map[string]string{"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2"},
		mnist("--epochs", "2", "--limit", "6000")...)
	j.k.waitOutput(j.k.latest(0, 2*time.Minute), regexp.MustCompile(`\[rank 0\] epoch=1 `), 4*time.Minute)
	victim := j.k.latest(1, 0)
	pids := victim.procs(filepath.Join(bin, "mnist"))
	if len(pids) == 0 {
		t.Fatalf("pod %s runs no mnist process:\n%s", victim.name, j.k.logs())
	}
	t0 := time.Now()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := j.waitCondition(batchv1.JobComplete, 5*time.Minute)
	t.Logf("worker killed in pod %s: the job completed %s later", victim.name, time.Since(t0).Round(10*time.Millisecond))
	if got.Status.Succeeded != 3 || got.Status.Failed != 0 {
		t.Errorf("job status succeeded %d failed %d, want 3 and 0", got.Status.Succeeded, got.Status.Failed)
	}
	for i := range 3 {
		if runs := j.k.runs(i); len(runs) != 1 {
			t.Errorf("index %d ran %d pods, want 1 (recovered in the pod, no replacement)", i, len(runs))
		}
	}
	if !final.MatchString(j.k.latest(0, 0).output()) {
		t.Fatalf("no ranks_agree=true after the crash:\n%s", j.k.logs())
	}
	killed := regexp.MustCompile(`gotrain: rank [23] on crash-1 was killed by SIGKILL\b.*: restarting all 6 ranks`)
	if !killed.MatchString(victim.output()) {
		t.Errorf("pod %s does not name the killed worker (%s):\n%s", victim.name, killed, j.k.logs())
	}
}

// Under PET_NNODES=2:3 a deleted pod (SIGTERM to its PID 1 from the
// kubelet) leaves the survivors training; the Job controller's replacement
// (same hostname, another IP) rejoins; deleting the Job stops every
// worker within the grace period, with no SIGKILL.
func TestPodDeletedReplacementRejoins(t *testing.T) {
	prog := []string{filepath.Join(bin, "gotrain"), "launch", "--", "sh", "-c",
		`trap 'echo "got TERM on $(hostname)"; exit 143' TERM; echo "start world=$WORLD_SIZE restart=$GOTRAIN_RESTART_COUNT on $(hostname)"; while :; do sleep 0.1; done`}
	j := newJob(t, "elastic", 3, map[string]string{"PET_NNODES": "2:3", "PET_NPROC_PER_NODE": "1"}, prog...)
	for i := range 3 {
		j.k.waitOutput(j.k.latest(i, 2*time.Minute), regexp.MustCompile(`start world=3 `), 3*time.Minute)
	}
	gone := j.k.latest(2, 0)
	t0 := time.Now()
	if err := cp.client.CoreV1().Pods("default").Delete(context.Background(), gone.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		j.k.waitOutput(j.k.latest(i, 0), regexp.MustCompile(`start world=2 restart=[1-9]`), 3*time.Minute)
	}
	t.Logf("pod %s deleted: the survivors run again as a world of 2 after %s", gone.name, time.Since(t0).Round(10*time.Millisecond))
	code, killed, goneAt := j.k.waitEnded(gone, time.Minute)
	if code != 143 || killed {
		t.Errorf("deleted pod %s: exit %d, SIGKILLed %v; want ended by SIGTERM with 143:\n%s", gone.name, code, killed, j.k.logs())
	}
	var repl *podRun
	for deadline := time.Now().Add(2 * time.Minute); repl == nil; time.Sleep(20 * time.Millisecond) {
		if runs := j.k.runs(2); len(runs) > 1 {
			repl = runs[len(runs)-1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the Job controller made no replacement for index 2:\n%s", j.k.logs())
		}
	}
	if repl.host.IP == gone.host.IP {
		t.Errorf("the replacement has the deleted pod's IP %s; the kubelet should give it another", gone.host.IP)
	}
	created := repl.started
	if p, err := cp.client.CoreV1().Pods("default").Get(context.Background(), repl.name, metav1.GetOptions{}); err == nil {
		created = p.CreationTimestamp.Time
	}
	for i := range 2 {
		j.k.waitOutput(j.k.latest(i, 0), regexp.MustCompile(`(?s)start world=2 .*start world=3 restart=\d+ on elastic-`+fmt.Sprint(i)), 3*time.Minute)
	}
	j.k.waitOutput(repl, regexp.MustCompile(`start world=3 restart=\d+ on elastic-2`), 2*time.Minute)
	// (created is the API server's clock, at one-second resolution.)
	t.Logf("pod %s deleted at 0: it ended (status Failed, 143) at %s; replacement %s (%s) created at ~%s, started at %s; the world is 3 again at %s",
		gone.name, goneAt.Sub(t0).Round(10*time.Millisecond), repl.name, repl.host.IP, created.Sub(t0).Round(time.Second),
		repl.started.Sub(t0).Round(10*time.Millisecond), time.Since(t0).Round(10*time.Millisecond))
	if testing.Verbose() {
		t.Logf("the replacement's output:\n%s", repl.output())
	}

	// Deleting the Job: the garbage collector deletes its pods, the
	// kubelet sends SIGTERM, gotrain stops its worker (10 s grace period,
	// inside the pods' 30 s).
	bg := metav1.DeletePropagationBackground
	if err := cp.client.BatchV1().Jobs("default").Delete(context.Background(), j.name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	runs := []*podRun{j.k.latest(0, 0), j.k.latest(1, 0), repl}
	for _, run := range runs {
		code, killed, _ := j.k.waitEnded(run, time.Minute)
		if code != 143 || killed || !strings.Contains(run.proc.Stdout(), "got TERM on "+run.hostname) {
			t.Errorf("pod %s: exit %d, SIGKILLed %v; want its worker stopped by SIGTERM and 143:\n%s", run.name, code, killed, j.k.logs())
		}
	}
	t.Logf("job deleted: every pod ended by SIGTERM within %s", time.Since(t1).Round(10*time.Millisecond))
}

// `gotrain torchrun train.py` with no flag, as a Trainer v2 or JobSet
// container runs it: an unchanged torch.distributed DDP program (gloo)
// on 2 pods × 2 ranks; PET_NNODES and PET_NPROC_PER_NODE from the
// template, python3 from the image's PATH.
func TestTorchrunInIndexedJob(t *testing.T) {
	script, err := filepath.Abs("../../integration/testdata/ddp_train.py")
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t, "ddp", 2, map[string]string{"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
		filepath.Join(bin, "gotrain"), "torchrun", script)
	got := j.waitCondition(batchv1.JobComplete, 5*time.Minute)
	if got.Status.Succeeded != 2 || got.Status.Failed != 0 {
		t.Errorf("job status succeeded %d failed %d, want 2 and 0", got.Status.Succeeded, got.Status.Failed)
	}
	if o := j.k.latest(0, 0).output(); !regexp.MustCompile(`world_size=4 loss .* ranks_agree=true`).MatchString(o) {
		t.Fatalf("no 4-rank ranks_agree=true from pod 0:\n%s", j.k.logs())
	}
}
