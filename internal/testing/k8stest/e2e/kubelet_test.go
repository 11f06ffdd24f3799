package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gotrain/gotrain/internal/testing/podsim"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// kubelet is a test kubelet of one node: it runs the pods of one Job that
// the Job controller creates on the API server (it binds them to itself:
// no scheduler runs), each on a free host of a virtual cluster
// (internal/testing/podsim: the host's address is the pod IP, gotrain is PID 1 of
// the pod), with the container's env resolved as the real kubelet does
// (values, the downward API's fieldRef, secretKeyRef), Secret volumes
// mounted, and an /etc/hosts per pod that holds its own name (as the
// kubelet writes it) and stands for the headless Service's DNS records
// (hostname.subdomain of every running pod, rewritten as pods come and
// go). It writes each pod's status back (Running with its IP; Succeeded or
// Failed with the container's exit code), and a deletion is SIGTERM to the
// pod's PID 1, SIGKILL after the pod's grace period, then the final delete.
//
// Not done (the tests' manifests need none of it): images (the command is
// a path on this machine), probes, restartPolicy other than Never, env
// $(VAR) expansion, envFrom, volumes other than Secrets, working dirs.
type kubelet struct {
	t        testing.TB
	client   kubernetes.Interface
	ns, node string
	selector string // label selector of the pods this kubelet runs
	dir      string
	ctx      context.Context // ended when the test does

	mu   sync.Mutex
	free []*vcluster.Host
	pods map[types.UID]*podRun
	all  []*podRun // every pod run, in start order, for logs
	errs []string  // what went wrong in the loop (reported by the test)
}

// podRun is one pod this kubelet started.
type podRun struct {
	name, hostname, subdomain string
	index                     string // the Job completion index
	hostsFile                 string // its /etc/hosts
	host                      *vcluster.Host
	proc                      *vcluster.Proc
	started                   time.Time

	terminating bool // deletion seen: SIGTERM sent
	termAt      time.Time
	grace       time.Duration
	killed      bool // SIGKILL after the grace period
	reported    bool // the final status is written
	endedAt     time.Time
	code        int
	released    bool // its host is free again (under kubelet.mu)
}

// newKubelet starts a kubelet with slots hosts for the pods that match
// selector in namespace ns; it stops when t ends.
func newKubelet(t testing.TB, client kubernetes.Interface, ns, selector string, slots int) *kubelet {
	t.Helper()
	k := &kubelet{t: t, client: client, ns: ns, node: "e2e-node", selector: selector, dir: t.TempDir(),
		pods: map[types.UID]*podRun{}}
	k.free = vcluster.New(t, slots, vcluster.Options{}).Hosts
	ctx, cancel := context.WithCancel(context.Background())
	k.ctx = ctx
	done := make(chan struct{})
	go func() {
		defer close(done)
		for tick := time.NewTicker(100 * time.Millisecond); ; {
			k.sync(ctx)
			select {
			case <-ctx.Done():
				tick.Stop()
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, e := range k.errs {
			t.Errorf("kubelet: %s", e)
		}
	})
	return k
}

func (k *kubelet) errorf(format string, args ...any) {
	if k.ctx.Err() != nil { // stopping: requests in flight are cancelled
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.errs = append(k.errs, fmt.Sprintf(format, args...))
}

// sync is one pass of the kubelet's loop over the pods the API server has.
func (k *kubelet) sync(ctx context.Context) {
	list, err := k.client.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.selector})
	if err != nil {
		if ctx.Err() == nil {
			k.errorf("list pods: %v", err)
		}
		return
	}
	seen := map[types.UID]bool{}
	changed := false
	for i := range list.Items {
		pod := &list.Items[i]
		seen[pod.UID] = true
		k.mu.Lock()
		run := k.pods[pod.UID]
		k.mu.Unlock()
		switch {
		case run == nil && pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodPending:
			if err := k.admit(ctx, pod); err != nil {
				k.errorf("pod %s: %v", pod.Name, err)
				k.fail(ctx, pod, err)
			}
			changed = true
		case run != nil:
			if k.step(ctx, pod, run) {
				changed = true
			}
		}
	}
	var gone []*podRun
	k.mu.Lock()
	for uid, run := range k.pods {
		if !seen[uid] { // deleted with no grace (or by the final delete)
			delete(k.pods, uid)
			gone = append(gone, run)
		}
	}
	k.mu.Unlock()
	for _, run := range gone {
		run.host.Kill()
		k.release(run)
		changed = true
	}
	if changed {
		if err := k.writeHosts(); err != nil {
			k.errorf("hosts: %v", err)
		}
	}
}

// step carries one running pod forward: a deletion becomes SIGTERM (then
// SIGKILL after the grace period), an exit its final status. It reports
// whether the pod stopped running.
func (k *kubelet) step(ctx context.Context, pod *corev1.Pod, run *podRun) bool {
	if pod.DeletionTimestamp != nil && !run.terminating {
		run.terminating, run.termAt = true, time.Now()
		run.grace = 30 * time.Second
		if g := pod.DeletionGracePeriodSeconds; g != nil {
			run.grace = time.Duration(*g) * time.Second
		}
		if pid, err := podsim.PID1(run.proc, 5*time.Second); err == nil {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	select {
	case <-run.proc.Done():
	default:
		if run.terminating && !run.killed && time.Since(run.termAt) > run.grace {
			k.mu.Lock()
			run.killed = true
			k.mu.Unlock()
			run.host.Kill()
		}
		return false
	}
	if run.reported {
		return false
	}
	code, _ := run.proc.Wait(time.Second) // ended: returns at once
	k.mu.Lock()
	run.code, run.reported, run.endedAt = code, true, time.Now()
	k.mu.Unlock()
	if err := k.writeStatus(ctx, pod, func(st *corev1.PodStatus) { terminated(st, run) }); err != nil {
		k.errorf("pod %s: final status: %v", pod.Name, err)
	}
	if run.terminating { // the kubelet's own delete ends a graceful deletion
		zero := int64(0)
		if err := k.client.CoreV1().Pods(k.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			k.errorf("pod %s: final delete: %v", pod.Name, err)
		}
	}
	k.release(run)
	return true
}

// release gives run's host back once the pod's last process is gone.
func (k *kubelet) release(run *podRun) {
	k.mu.Lock()
	done := run.released
	run.released = true
	k.mu.Unlock()
	if done {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); len(run.host.Pids()) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	k.mu.Lock()
	k.free = append(k.free, run.host)
	k.mu.Unlock()
}

// admit binds pod to this node and starts its container.
func (k *kubelet) admit(ctx context.Context, pod *corev1.Pod) error {
	if len(pod.Spec.Containers) != 1 {
		return fmt.Errorf("%d containers: this kubelet runs one", len(pod.Spec.Containers))
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		return fmt.Errorf("restartPolicy %s: this kubelet runs Never only", pod.Spec.RestartPolicy)
	}
	k.mu.Lock()
	if len(k.free) == 0 {
		k.mu.Unlock()
		return nil // no room yet: next pass
	}
	host := k.free[0]
	k.free = k.free[1:]
	k.mu.Unlock()
	if pod.Spec.NodeName == "" {
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: k.node}}
		if err := k.client.CoreV1().Pods(k.ns).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
			k.mu.Lock()
			k.free = append(k.free, host)
			k.mu.Unlock()
			return fmt.Errorf("bind: %w", err)
		}
		pod.Spec.NodeName = k.node
	}
	pod.Status.PodIP, pod.Status.HostIP = host.IP, host.IP
	c := pod.Spec.Containers[0]
	env, err := k.env(ctx, pod, c)
	if err != nil {
		return err
	}
	mounts, err := k.volumes(ctx, pod, c)
	if err != nil {
		return err
	}
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	// A container's own /tmp (short: the workers' socket paths must fit
	// in 108 bytes).
	tmp, err := os.MkdirTemp("", "gte2e-")
	if err != nil {
		return err
	}
	k.t.Cleanup(func() { os.RemoveAll(tmp) })
	env = append([]string{"TMPDIR=" + tmp, "GOTRAIN_SLURM=off"}, env...)
	run := &podRun{name: pod.Name, hostname: hostname, subdomain: pod.Spec.Subdomain, host: host, started: time.Now(),
		index: pod.Labels["batch.kubernetes.io/job-completion-index"], hostsFile: filepath.Join(k.dir, pod.Name+".hosts")}
	// As the kubelet writes a pod's own name into its /etc/hosts before
	// the container starts.
	if err := k.writeHosts(run); err != nil {
		return err
	}
	run.proc = podsim.Start(host, podsim.Pod{Hostname: hostname, HostsFile: run.hostsFile, Mounts: mounts, Env: env,
		Argv: append(slices.Clone(c.Command), c.Args...)})
	k.mu.Lock()
	k.pods[pod.UID] = run
	k.all = append(k.all, run)
	k.mu.Unlock()
	now := metav1.Now()
	return k.writeStatus(ctx, pod, func(st *corev1.PodStatus) {
		st.Phase, st.PodIP, st.HostIP, st.StartTime = corev1.PodRunning, host.IP, host.IP, &now
		st.PodIPs = []corev1.PodIP{{IP: host.IP}}
		st.Conditions = conditions(now, corev1.ConditionTrue)
		started := true
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	})
}

// fail marks a pod that could not be started Failed.
func (k *kubelet) fail(ctx context.Context, pod *corev1.Pod, cause error) {
	_ = k.writeStatus(ctx, pod, func(st *corev1.PodStatus) {
		st.Phase, st.Reason, st.Message = corev1.PodFailed, "CreateContainerConfigError", cause.Error()
	})
}

func terminated(st *corev1.PodStatus, run *podRun) {
	now := metav1.Now()
	st.Phase, st.Reason = corev1.PodSucceeded, "Completed"
	if run.code != 0 {
		st.Phase, st.Reason = corev1.PodFailed, "Error"
	}
	st.Conditions = conditions(now, corev1.ConditionFalse)
	for i := range st.ContainerStatuses {
		cs := &st.ContainerStatuses[i]
		cs.Ready, cs.Started = false, new(bool)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(run.code),
			Reason: st.Reason, StartedAt: metav1.NewTime(run.started), FinishedAt: now}}
	}
}

func conditions(now metav1.Time, ready corev1.ConditionStatus) []corev1.PodCondition {
	var out []corev1.PodCondition
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		s := corev1.ConditionTrue
		if c == corev1.ContainersReady || c == corev1.PodReady {
			s = ready
		}
		out = append(out, corev1.PodCondition{Type: c, Status: s, LastTransitionTime: now})
	}
	return out
}

// writeStatus applies set to the pod's newest status and writes it.
func (k *kubelet) writeStatus(ctx context.Context, pod *corev1.Pod, set func(*corev1.PodStatus)) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := k.client.CoreV1().Pods(k.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		set(&cur.Status)
		_, err = k.client.CoreV1().Pods(k.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// fieldRef is the downward API's metadata.labels['KEY'] or
// metadata.annotations['KEY'].
var fieldRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// env resolves the container's env as the kubelet does, after its own
// variables (HOSTNAME, the kubernetes Service's).
func (k *kubelet) env(ctx context.Context, pod *corev1.Pod, c corev1.Container) ([]string, error) {
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	env := []string{"HOSTNAME=" + hostname, "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"}
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("envFrom: not done by this kubelet")
	}
	for _, e := range c.Env {
		if strings.Contains(e.Value, "$(") {
			return nil, fmt.Errorf("env %s: $(VAR) expansion is not done by this kubelet", e.Name)
		}
		v := e.Value
		switch from := e.ValueFrom; {
		case from == nil:
		case from.FieldRef != nil:
			path := from.FieldRef.FieldPath
			switch m := fieldRef.FindStringSubmatch(path); {
			case m != nil && m[1] == "labels":
				v = pod.Labels[m[2]]
			case m != nil:
				v = pod.Annotations[m[2]]
			case path == "metadata.name":
				v = pod.Name
			case path == "metadata.namespace":
				v = pod.Namespace
			case path == "metadata.uid":
				v = string(pod.UID)
			case path == "spec.nodeName":
				v = pod.Spec.NodeName
			case path == "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			case path == "status.podIP", path == "status.hostIP":
				v = pod.Status.PodIP
			default:
				return nil, fmt.Errorf("env %s: fieldRef %s is not done by this kubelet", e.Name, path)
			}
		case from.SecretKeyRef != nil:
			s, err := k.client.CoreV1().Secrets(k.ns).Get(ctx, from.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			b, ok := s.Data[from.SecretKeyRef.Key]
			if !ok {
				return nil, fmt.Errorf("env %s: secret %s has no key %s", e.Name, s.Name, from.SecretKeyRef.Key)
			}
			v = string(b)
		default:
			return nil, fmt.Errorf("env %s: this valueFrom is not done by this kubelet", e.Name)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// volumes writes the pod's Secret volumes (each key a file, mode
// defaultMode) and returns where the container mounts them.
func (k *kubelet) volumes(ctx context.Context, pod *corev1.Pod, c corev1.Container) ([]podsim.Mount, error) {
	var mounts []podsim.Mount
	for _, vm := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || pod.Spec.Volumes[i].Secret == nil || vm.SubPath != "" || len(pod.Spec.Volumes[i].Secret.Items) > 0 {
			return nil, fmt.Errorf("volume %s: only whole Secret volumes are done by this kubelet", vm.Name)
		}
		src := pod.Spec.Volumes[i].Secret
		s, err := k.client.CoreV1().Secrets(k.ns).Get(ctx, src.SecretName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		mode := os.FileMode(0o644)
		if src.DefaultMode != nil {
			mode = os.FileMode(*src.DefaultMode)
		}
		dir := filepath.Join(k.dir, pod.Name, vm.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for key, data := range s.Data {
			if err := os.WriteFile(filepath.Join(dir, key), data, mode); err != nil {
				return nil, err
			}
		}
		mounts = append(mounts, podsim.Mount{Source: dir, Target: vm.MountPath})
	}
	return mounts, nil
}

// writeHosts writes every running pod's hosts file (and starting's, the
// pod about to start) with a record for each running pod that has a
// hostname and subdomain, as the headless Service's DNS would answer. A
// pod's file is bind-mounted, so it is rewritten in place: the new text
// over the old, then cut to its length, never an empty file that a reader
// could catch (as truncating first would give).
func (k *kubelet) writeHosts(starting ...*podRun) error {
	k.mu.Lock()
	var live []*podRun
	for _, run := range append(slices.Clone(k.all), starting...) {
		if !run.released && !run.reported {
			live = append(live, run)
		}
	}
	k.mu.Unlock()
	for _, owner := range live {
		// The kubelet's own lines, then the Service's records; the
		// owner's record also names its short hostname, as the kubelet
		// writes it (gloo, for one, resolves it to bind).
		var b strings.Builder
		b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
		if owner.subdomain == "" {
			fmt.Fprintf(&b, "%s\t%s\n", owner.host.IP, owner.hostname)
		}
		for _, run := range live {
			if run.subdomain == "" {
				continue
			}
			fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.cluster.local\t%s.%s", run.host.IP, run.hostname, run.subdomain, k.ns, run.hostname, run.subdomain)
			if run == owner {
				fmt.Fprintf(&b, "\t%s", run.hostname)
			}
			b.WriteString("\n")
		}
		if err := rewrite(owner.hostsFile, b.String()); err != nil {
			return err
		}
	}
	return nil
}

// rewrite writes text over name's old contents and cuts it to its length.
func rewrite(name, text string) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(text), 0)
	if err == nil {
		err = f.Truncate(int64(len(text)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// runs are the pods of completion index idx this kubelet started, oldest
// first.
func (k *kubelet) runs(idx int) []*podRun {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*podRun
	for _, run := range k.all {
		if run.index == strconv.Itoa(idx) {
			out = append(out, run)
		}
	}
	return out
}

// latest is the newest pod of index idx, waiting up to d for one.
func (k *kubelet) latest(idx int, d time.Duration) *podRun {
	k.t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if runs := k.runs(idx); len(runs) > 0 {
			return runs[len(runs)-1]
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("no pod of index %d started within %s:\n%s", idx, d, k.logs())
		}
	}
}

func (run *podRun) output() string { return run.proc.Stdout() + run.proc.Stderr() }

// logs are every pod's output, for failure messages.
func (k *kubelet) logs() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b strings.Builder
	for _, run := range k.all {
		fmt.Fprintf(&b, "=== pod %s (index %s) stdout:\n%s=== stderr:\n%s", run.name, run.index, run.proc.Stdout(), run.proc.Stderr())
	}
	return b.String()
}

// waitOutput waits until run's output matches re.
func (k *kubelet) waitOutput(run *podRun, re *regexp.Regexp, d time.Duration) {
	k.t.Helper()
	for deadline := time.Now().Add(d); !re.MatchString(run.output()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			k.t.Fatalf("pod %s: no %q within %s:\n%s", run.name, re, d, k.logs())
		}
	}
}

// procs are the host pids of the pod's processes whose argv[0] is program.
func (run *podRun) procs(program string) []int { return podsim.Procs(run.host, program) }

// waitEnded waits up to d for run's final status and returns its exit code
// and whether it was SIGKILLed.
func (k *kubelet) waitEnded(run *podRun, d time.Duration) (code int, killed bool, at time.Time) {
	k.t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		k.mu.Lock()
		ended, code, killed, at := run.reported, run.code, run.killed, run.endedAt
		k.mu.Unlock()
		if ended {
			return code, killed, at
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("pod %s has not ended within %s:\n%s", run.name, d, k.logs())
		}
	}
}
