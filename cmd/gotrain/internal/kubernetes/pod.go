package kubernetes

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/launcher"
)

// The variables a pod is read from. Each controller's own name for them is
// cited in pod_test.go.
const (
	// EnvServiceHost is set by the kubelet in every container: without it
	// this is no pod.
	EnvServiceHost = "KUBERNETES_SERVICE_HOST"
	// EnvOff, set to "off" (or "0", "false"), makes gotrain ignore all of
	// the variables below.
	EnvOff = "GOTRAIN_KUBERNETES"

	// Kubeflow Trainer v2's Torch plugin (and PyTorchJob's elastic policy).
	EnvPETNodeRank     = "PET_NODE_RANK"
	EnvPETNNodes       = "PET_NNODES"
	EnvPETNprocPerNode = "PET_NPROC_PER_NODE"
	EnvPETMasterAddr   = "PET_MASTER_ADDR"
	EnvPETMasterPort   = "PET_MASTER_PORT"
	EnvPETRdzvEndpoint = "PET_RDZV_ENDPOINT"
	EnvPETRdzvID       = "PET_RDZV_ID"

	// The Job controller, in every pod of an Indexed Job (JobSet's too).
	EnvCompletionIndex = "JOB_COMPLETION_INDEX"

	// LeaderWorkerSet's pod webhook.
	EnvLWSLeaderAddress = "LWS_LEADER_ADDRESS"
	EnvLWSGroupSize     = "LWS_GROUP_SIZE"
	EnvLWSWorkerIndex   = "LWS_WORKER_INDEX"

	// Volcano's env plugin (both names, one value).
	EnvVCTaskIndex = "VC_TASK_INDEX"
	EnvVKTaskIndex = "VK_TASK_INDEX"

	// PyTorchJob v1 and Volcano's pytorch plugin: these count pods.
	EnvMasterAddr = "MASTER_ADDR"
	EnvMasterPort = "MASTER_PORT"
	EnvWorldSize  = "WORLD_SIZE"
	EnvRank       = "RANK"

	// EnvRestartAttempt is ours: a manifest sets it from the JobSet's
	// restart attempt (the downward API of the pod label
	// jobset.sigs.k8s.io/restart-attempt) so that the pods of a recreated
	// JobSet make a run of their own and never join the stale one.
	EnvRestartAttempt = "GOTRAIN_RESTART_ATTEMPT"
)

// DefaultPort is the coordinator's port where the workload names none
// (Trainer v2's PET_MASTER_PORT is the same, 29400).
const DefaultPort = 29400

// ErrPod is wrapped by the errors of FromEnv and Apply: the variables say
// a pod of a training job but not a coherent one.
var ErrPod = errors.New("kubernetes: inconsistent pod variables")

// Workload names the kind of job a pod belongs to.
type Workload string

// The workloads FromEnv tells apart.
const (
	TrainJob   Workload = "Kubeflow TrainJob"
	JobSet     Workload = "JobSet"
	IndexedJob Workload = "Indexed Job"
	PyTorchJob Workload = "PyTorchJob"
	Volcano    Workload = "Volcano Job"
	LWS        Workload = "LeaderWorkerSet"
)

// Pod is this pod's place in its training job.
type Pod struct {
	Workload Workload
	// Hostname is the pod's hostname; Subdomain its headless Service's
	// name (from /etc/hosts, "" without one).
	Hostname, Subdomain string
	// NodeRank is the pod's index in the job's node order; -1: none (the
	// order pods join in). RankFrom names the variable it came from.
	NodeRank int
	RankFrom string
	// MinNodes and Nodes are the job's pod count (MIN:MAX when elastic);
	// 0: not said. NodesFrom names the source.
	MinNodes, Nodes int
	NodesFrom       string
	// CoordHost:CoordPort is the coordinator (node rank 0's agent).
	// CoordFrom names the source.
	CoordHost string
	CoordPort int
	CoordFrom string
	// Nproc is PET_NPROC_PER_NODE as given (N, auto, gpu or cpu), "" none.
	Nproc string
	// RunID is PET_RDZV_ID, or one made of the coordinator's pod and the
	// restart attempt.
	RunID string
	// RunsCoordinator: this pod's agent starts the coordinator.
	RunsCoordinator bool
}

// FromEnv reads the pod this process runs in; nil (and no error) outside a
// pod, in a pod of no training workload (no variable below set), or with
// GOTRAIN_KUBERNETES=off. hostname is the pod's, hosts the content of
// /etc/hosts ("" if unread), whose line for the pod names its subdomain.
func FromEnv(getenv func(string) string, hostname, hosts string) (*Pod, error) {
	if v := getenv(EnvOff); v == "off" || v == "0" || v == "false" {
		return nil, nil
	}
	if getenv(EnvServiceHost) == "" {
		return nil, nil
	}
	r := &podReader{getenv: getenv, p: &Pod{Hostname: hostname, Subdomain: Subdomain(hosts, hostname), NodeRank: -1}}
	r.podsRank = getenv(EnvMasterAddr) != "" && getenv(EnvWorldSize) != "" && getenv(EnvRank) != "" && getenv("LOCAL_RANK") == ""
	if r.p.Workload = r.workload(); r.p.Workload == "" {
		return nil, nil
	}
	r.nodeRank()
	r.nodeCount()
	r.coordinator()
	if r.err != nil {
		return nil, r.err
	}
	r.p.Nproc = getenv(EnvPETNprocPerNode)
	r.roles()
	return r.p, nil
}

// podReader reads one pod's variables into p, section by section (the
// first source present wins in each); err is the first inconsistency.
type podReader struct {
	getenv func(string) string
	p      *Pod
	err    error
	// podsRank: MASTER_ADDR, WORLD_SIZE and RANK count pods (PyTorchJob
	// v1, Volcano's pytorch plugin), not processes (no LOCAL_RANK).
	podsRank bool
}

func (r *podReader) workload() Workload {
	env := r.getenv
	switch {
	case env(EnvPETMasterAddr) != "" && env(EnvPETNNodes) != "":
		return TrainJob
	case env(EnvLWSLeaderAddress) != "" || env(EnvLWSWorkerIndex) != "":
		return LWS
	case env(EnvVCTaskIndex) != "" || env(EnvVKTaskIndex) != "":
		return Volcano
	case env(EnvPETRdzvEndpoint) != "" || r.podsRank && env(EnvCompletionIndex) == "":
		return PyTorchJob
	case env(EnvCompletionIndex) != "":
		if _, _, _, ok := jobSetHost(r.p.Hostname, r.p.Subdomain); ok {
			return JobSet
		}
		return IndexedJob
	case env(EnvPETNodeRank) != "" || env(EnvPETNNodes) != "":
		return TrainJob // PET_* by hand: torchrun's own variables
	}
	return ""
}

// num is variable name as a number of 0 or more; -1 (and r.err) if not.
func (r *podReader) num(name string) int {
	if r.err != nil {
		return -1
	}
	v, e := strconv.Atoi(r.getenv(name))
	if e != nil || v < 0 {
		r.err = fmt.Errorf("%w: %s=%q is not a number of 0 or more", ErrPod, name, r.getenv(name))
		return -1
	}
	return v
}

// volcanoPyTorch: in a Volcano pod with the pytorch plugin RANK counts the
// job's pods, where VC_TASK_INDEX counts only its task's (master 0 and
// worker 0 would collide).
func (r *podReader) volcanoPyTorch() bool { return r.p.Workload == Volcano && r.podsRank }

func (r *podReader) nodeRank() {
	p, env := r.p, r.getenv
	switch {
	case env(EnvPETNodeRank) != "":
		p.RankFrom = EnvPETNodeRank
	case env(EnvCompletionIndex) != "":
		p.RankFrom = EnvCompletionIndex
	case env(EnvLWSWorkerIndex) != "":
		p.RankFrom = EnvLWSWorkerIndex
	case r.volcanoPyTorch():
		p.RankFrom = EnvRank
	case env(EnvVCTaskIndex) != "":
		p.RankFrom = EnvVCTaskIndex
	case env(EnvVKTaskIndex) != "":
		p.RankFrom = EnvVKTaskIndex
	case r.podsRank:
		p.RankFrom = EnvRank
	}
	if p.RankFrom != "" {
		p.NodeRank = r.num(p.RankFrom)
	}
	if p.Workload == JobSet && p.RankFrom == EnvCompletionIndex {
		// The completion index counts the pods of one child Job: only the
		// first Job's are the job's node order.
		if _, job, _, _ := jobSetHost(p.Hostname, p.Subdomain); job > 0 {
			p.NodeRank, p.RankFrom = -1, ""
		}
	}
}

func (r *podReader) nodeCount() {
	p, env := r.p, r.getenv
	task := volcanoTaskNum(p.Hostname, p.Subdomain)
	switch {
	case env(EnvPETNNodes) != "":
		p.NodesFrom = EnvPETNNodes
		min, max, e := host.ParseNNodes(env(EnvPETNNodes))
		if e != nil && r.err == nil {
			r.err = fmt.Errorf("%w: %s=%q: %w", ErrPod, EnvPETNNodes, env(EnvPETNNodes), e)
		}
		p.MinNodes, p.Nodes = min, max
	case env(EnvLWSGroupSize) != "":
		p.NodesFrom = EnvLWSGroupSize
		p.Nodes = r.num(EnvLWSGroupSize)
	case p.Workload == Volcano && !r.volcanoPyTorch() && task != "" && env(task) != "":
		p.NodesFrom = task
		p.Nodes = r.num(p.NodesFrom)
	case r.podsRank:
		p.NodesFrom = EnvWorldSize
		p.Nodes = r.num(EnvWorldSize)
	}
	if p.Nodes > 0 && p.MinNodes == 0 {
		p.MinNodes = p.Nodes
	}
	if p.NodesFrom != "" && p.Nodes == 0 && r.err == nil {
		r.err = fmt.Errorf("%w: %s=%q: want 1 or more pods", ErrPod, p.NodesFrom, env(p.NodesFrom))
	}
}

func (r *podReader) coordinator() {
	env := r.getenv
	switch {
	case env(EnvPETMasterAddr) != "":
		r.hostPort(env(EnvPETMasterAddr), env(EnvPETMasterPort), EnvPETMasterAddr)
	case env(EnvPETRdzvEndpoint) != "":
		h, port, e := net.SplitHostPort(env(EnvPETRdzvEndpoint))
		if e != nil {
			h, port = env(EnvPETRdzvEndpoint), ""
		}
		r.hostPort(h, port, EnvPETRdzvEndpoint)
	case env(EnvMasterAddr) != "":
		r.hostPort(env(EnvMasterAddr), env(EnvMasterPort), EnvMasterAddr)
	case env(EnvLWSLeaderAddress) != "":
		r.hostPort(env(EnvLWSLeaderAddress), "", EnvLWSLeaderAddress)
	default:
		r.coordinatorFromHostname()
	}
}

// coordinatorFromHostname derives node rank 0's pod from this pod's
// hostname and subdomain, where the workload names its pods in order.
func (r *podReader) coordinatorFromHostname() {
	p := r.p
	switch {
	case p.Workload == JobSet:
		js, _, _, _ := jobSetHost(p.Hostname, p.Subdomain)
		r.hostPort(js+"-0-0."+p.Subdomain, "", "the JobSet hostname")
	case p.Workload == IndexedJob && p.Subdomain != "":
		if job, ok := indexedJob(p.Hostname); ok {
			r.hostPort(job+"-0."+p.Subdomain, "", "the Indexed Job hostname")
		}
	case p.Workload == Volcano && p.Subdomain != "":
		if i := strings.LastIndexByte(p.Hostname, '-'); i > 0 {
			r.hostPort(p.Hostname[:i]+"-0."+p.Subdomain, "", "the Volcano hostname")
		}
	}
}

// hostPort sets the coordinator to addr:port (DefaultPort where port is "").
func (r *podReader) hostPort(addr, port, from string) {
	p := r.p
	p.CoordHost, p.CoordPort, p.CoordFrom = addr, DefaultPort, from
	if port != "" {
		n, e := strconv.Atoi(port)
		if (e != nil || n < 1 || n > 65535) && r.err == nil {
			r.err = fmt.Errorf("%w: %s=%q is not a port", ErrPod, from, port)
		}
		p.CoordPort = n
	}
}

// roles decides whether this pod runs the coordinator, and the run id.
func (r *podReader) roles() {
	p := r.p
	switch {
	case p.NodeRank == 0:
		p.RunsCoordinator = true
	case p.NodeRank < 0 && p.CoordHost != "":
		first, _, _ := strings.Cut(p.CoordHost, ".")
		p.RunsCoordinator = first == p.Hostname
	}
	p.RunID = r.getenv(EnvPETRdzvID)
	if p.RunID == "" && p.CoordHost != "" {
		first, _, _ := strings.Cut(p.CoordHost, ".")
		p.RunID = "k8s-" + first
		if a := r.getenv(EnvRestartAttempt); a != "" {
			p.RunID += "-attempt-" + a
		}
	}
}

// jobSetHost splits a JobSet pod's hostname, <jobset>-<rjob>-<job>-<pod>,
// whose JobSet is its subdomain (JobSet's default headless Service):
// prefix is <jobset>-<rjob>.
func jobSetHost(hostname, subdomain string) (prefix string, job, pod int, ok bool) {
	if subdomain == "" || !strings.HasPrefix(hostname, subdomain+"-") {
		return "", 0, 0, false
	}
	parts := strings.Split(hostname[len(subdomain)+1:], "-")
	if len(parts) < 3 {
		return "", 0, 0, false
	}
	j, e1 := strconv.Atoi(parts[len(parts)-2])
	pd, e2 := strconv.Atoi(parts[len(parts)-1])
	if e1 != nil || e2 != nil {
		return "", 0, 0, false
	}
	return subdomain + "-" + strings.Join(parts[:len(parts)-2], "-"), j, pd, true
}

// indexedJob is the Job name of an Indexed Job pod's hostname, <job>-<index>.
func indexedJob(hostname string) (string, bool) {
	i := strings.LastIndexByte(hostname, '-')
	if i <= 0 {
		return "", false
	}
	if _, err := strconv.Atoi(hostname[i+1:]); err != nil {
		return "", false
	}
	return hostname[:i], true
}

// volcanoTaskNum is the svc plugin's count variable of the pod's task:
// hostname <job>-<task>-<index>, the job its subdomain, gives
// VC_<TASK>_NUM (upper case, '-' as '_').
func volcanoTaskNum(hostname, subdomain string) string {
	if subdomain == "" || !strings.HasPrefix(hostname, subdomain+"-") {
		return ""
	}
	rest := hostname[len(subdomain)+1:]
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return ""
	}
	return "VC_" + strings.ToUpper(strings.ReplaceAll(rest[:i], "-", "_")) + "_NUM"
}

// Subdomain is the pod's subdomain from /etc/hosts, where the kubelet
// writes "IP HOSTNAME.SUBDOMAIN.NAMESPACE.svc.DOMAIN HOSTNAME" for a pod
// with one; "" without.
func Subdomain(hosts, hostname string) string {
	if hostname == "" {
		return ""
	}
	for _, line := range strings.Split(hosts, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		for _, name := range f[1:] {
			if rest, ok := strings.CutPrefix(name, hostname+"."); ok {
				sub, _, _ := strings.Cut(rest, ".")
				return sub
			}
		}
	}
	return ""
}

// Coordinator is the coordinator's HOST:PORT.
func (p *Pod) Coordinator() string {
	return net.JoinHostPort(p.CoordHost, strconv.Itoa(p.CoordPort))
}

// Apply turns p into cfg's settings where the command line (given: the
// flags set, by name) left them out:
//   - --nnodes: the pod count (MIN:MAX from PET_NNODES);
//   - --coordinator: the pod with node rank 0 (or, without ranks, the one
//     whose hostname the coordinator's address names) starts it, listening
//     on 0.0.0.0:PORT; every other pod joins HOST:PORT, and would serve a
//     replica at the same port;
//   - --node-rank: the pod's node rank, when the workload gives one;
//   - --run-id: PET_RDZV_ID, or k8s-<coordinator pod>[-attempt-N].
//
// --nproc-per-node (PET_NPROC_PER_NODE) is the caller's, which resolves
// its words. An error names what is missing and the manifest lines that
// give it. A nil p changes nothing.
func (p *Pod) Apply(cfg *launcher.Config, given map[string]bool) error {
	if p == nil {
		return nil
	}
	if !given[host.FlagNodes] {
		if p.Nodes == 0 {
			return fmt.Errorf("%w: this is a pod of a %s (%s), but nothing says how many pods train together: set %s in the pod template (e.g. env: [{name: %s, value: \"3\"}], or \"2:4\" to run on 2 to 4 pods), or pass --nnodes",
				ErrPod, p.Workload, p.detected(), EnvPETNNodes, EnvPETNNodes)
		}
		cfg.Nodes, cfg.MinNodes = p.Nodes, p.MinNodes
	}
	multi := cfg.Nodes > 1 || cfg.MinNodes > 1
	if multi && !given["coordinator"] && !given["coordinator-listen"] {
		if p.CoordHost == "" {
			return fmt.Errorf("%w: this is a pod of a %s (%s), but nothing names the pod that runs the coordinator: give the pod template a subdomain (a headless Service) or set %s and %s (the first pod's DNS name and a port), or pass --coordinator",
				ErrPod, p.Workload, p.detected(), EnvMasterAddr, EnvMasterPort)
		}
		listen := net.JoinHostPort("0.0.0.0", strconv.Itoa(p.CoordPort))
		if p.RunsCoordinator {
			cfg.Coordinator, cfg.CoordinatorListen = "", listen
		} else {
			cfg.Coordinator, cfg.CoordinatorListen = p.Coordinator(), listen
		}
	}
	if !given["node-rank"] && p.NodeRank >= 0 {
		r := p.NodeRank
		cfg.NodeRank = &r
	}
	if !given[host.FlagRunID] && cfg.RunID == "" {
		cfg.RunID = p.RunID
	}
	cfg.Scheduled = true // every pod is told the coordinator: nothing to copy by hand
	return nil
}

// detected names the variables FromEnv went by, for errors.
func (p *Pod) detected() string {
	var from []string
	for _, s := range []string{p.RankFrom, p.NodesFrom, p.CoordFrom} {
		if s != "" {
			from = append(from, s)
		}
	}
	if len(from) == 0 {
		return "hostname " + p.Hostname
	}
	return "from " + strings.Join(from, ", ")
}

// Summary is one line saying what was taken from the pod, for --verbose.
func (p *Pod) Summary(cfg *launcher.Config) string {
	rank := "node rank by join order"
	if p.NodeRank >= 0 {
		rank = fmt.Sprintf("node rank %d (%s)", p.NodeRank, p.RankFrom)
	}
	nodes := strconv.Itoa(cfg.Nodes)
	if cfg.MinNodes != 0 && cfg.MinNodes != cfg.Nodes {
		nodes = fmt.Sprintf("%d:%d", cfg.MinNodes, cfg.Nodes)
	}
	role := "joins the coordinator at " + cfg.Coordinator
	if cfg.Coordinator == "" {
		role = "runs the coordinator at " + cfg.CoordinatorListen
	}
	return fmt.Sprintf("kubernetes: %s pod %s: %s of %s pods; this agent %s (run %s)", p.Workload, p.Hostname, rank, nodes, role, cfg.RunID)
}
