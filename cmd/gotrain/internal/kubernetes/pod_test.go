package kubernetes

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// hostsFor is /etc/hosts as the kubelet writes it for a pod with a
// subdomain (kubelet's managed hosts file: "IP FQDN HOSTNAME").
func hostsFor(ip, hostname, subdomain string) string {
	return "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		ip + "\t" + hostname + "." + subdomain + ".default.svc.cluster.local\t" + hostname + "\n"
}

const kube = "KUBERNETES_SERVICE_HOST"

// The fixtures: each is a pod's environment and hostname as its
// controller makes them, cited by source file.
var fixtures = []struct {
	name, hostname, hosts string
	env                   []string
	want                  string // Pod as %+v; "" for nil; "error" for an ErrPod
}{
	{name: "not a pod", hostname: "node1", env: []string{EnvPETNNodes, "2", EnvPETNodeRank, "0"}, want: ""},
	{name: "a pod of no training workload", hostname: "web-5d9c7", env: []string{kube, "10.96.0.1"}, want: ""},
	{name: "off", hostname: "t-node-0-1", env: []string{kube, "10.96.0.1", EnvOff, "off", EnvPETNNodes, "2", EnvPETNodeRank, "1", EnvPETMasterAddr, "t-node-0-0.t"}, want: ""},

	// kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go
	// (EnforceMLPolicy) with pkg/constants/constants.go: PET_NNODES (the
	// trainer's node count), PET_NPROC_PER_NODE, PET_NODE_RANK from
	// metadata.annotations['batch.kubernetes.io/job-completion-index'],
	// PET_MASTER_ADDR "<trainjob>-node-0-0.<trainjob>", PET_MASTER_PORT
	// 29400 (ContainerTrainerPort). The TrainJob is a JobSet: hostname
	// <trainjob>-node-0-<index>, subdomain <trainjob>.
	{name: "Trainer v2 TrainJob, pod 1 of 3", hostname: "mnist-node-0-1", hosts: hostsFor("10.1.0.5", "mnist-node-0-1", "mnist"),
		env: []string{kube, "10.96.0.1", EnvPETNNodes, "3", EnvPETNprocPerNode, "auto", EnvPETNodeRank, "1",
			EnvPETMasterAddr, "mnist-node-0-0.mnist", EnvPETMasterPort, "29400", EnvCompletionIndex, "1"},
		want: "{Workload:Kubeflow TrainJob Hostname:mnist-node-0-1 Subdomain:mnist NodeRank:1 RankFrom:PET_NODE_RANK MinNodes:3 Nodes:3 NodesFrom:PET_NNODES CoordHost:mnist-node-0-0.mnist CoordPort:29400 CoordFrom:PET_MASTER_ADDR Nproc:auto RunID:k8s-mnist-node-0-0 RunsCoordinator:false}"},
	{name: "Trainer v2 TrainJob, pod 0", hostname: "mnist-node-0-0", hosts: hostsFor("10.1.0.4", "mnist-node-0-0", "mnist"),
		env: []string{kube, "10.96.0.1", EnvPETNNodes, "3", EnvPETNprocPerNode, "2", EnvPETNodeRank, "0",
			EnvPETMasterAddr, "mnist-node-0-0.mnist", EnvPETMasterPort, "29400", EnvCompletionIndex, "0"},
		want: "{Workload:Kubeflow TrainJob Hostname:mnist-node-0-0 Subdomain:mnist NodeRank:0 RankFrom:PET_NODE_RANK MinNodes:3 Nodes:3 NodesFrom:PET_NNODES CoordHost:mnist-node-0-0.mnist CoordPort:29400 CoordFrom:PET_MASTER_ADDR Nproc:2 RunID:k8s-mnist-node-0-0 RunsCoordinator:true}"},

	// kubernetes-sigs/jobset: pods of ReplicatedJob "workers" of JobSet
	// "train" are Indexed Job pods (the Job controller's
	// JOB_COMPLETION_INDEX, pkg/controller/job/indexed_job_utils.go in
	// kubernetes/kubernetes), hostname <jobset>-<rjob>-<job>-<pod>,
	// subdomain the JobSet's name (spec.network.subdomain's default);
	// jobset.sigs.k8s.io/restart-attempt (pkg/constants RestartsKey) is a
	// label the manifest passes on as GOTRAIN_RESTART_ATTEMPT.
	{name: "JobSet, elastic, pod 2 after a restart", hostname: "train-workers-0-2", hosts: hostsFor("10.1.0.9", "train-workers-0-2", "train"),
		env:  []string{kube, "10.96.0.1", EnvCompletionIndex, "2", EnvPETNNodes, "2:4", EnvRestartAttempt, "1"},
		want: "{Workload:JobSet Hostname:train-workers-0-2 Subdomain:train NodeRank:2 RankFrom:JOB_COMPLETION_INDEX MinNodes:2 Nodes:4 NodesFrom:PET_NNODES CoordHost:train-workers-0-0.train CoordPort:29400 CoordFrom:the JobSet hostname Nproc: RunID:k8s-train-workers-0-0-attempt-1 RunsCoordinator:false}"},
	{name: "JobSet, second child Job: ranks by join order", hostname: "train-workers-1-0", hosts: hostsFor("10.1.0.10", "train-workers-1-0", "train"),
		env:  []string{kube, "10.96.0.1", EnvCompletionIndex, "0", EnvPETNNodes, "4"},
		want: "{Workload:JobSet Hostname:train-workers-1-0 Subdomain:train NodeRank:-1 RankFrom: MinNodes:4 Nodes:4 NodesFrom:PET_NNODES CoordHost:train-workers-0-0.train CoordPort:29400 CoordFrom:the JobSet hostname Nproc: RunID:k8s-train-workers-0-0 RunsCoordinator:false}"},
	{name: "JobSet with a dashed replicated job name", hostname: "llm-gpu-workers-0-0", hosts: hostsFor("10.1.0.11", "llm-gpu-workers-0-0", "llm"),
		env:  []string{kube, "10.96.0.1", EnvCompletionIndex, "0", EnvPETNNodes, "2"},
		want: "{Workload:JobSet Hostname:llm-gpu-workers-0-0 Subdomain:llm NodeRank:0 RankFrom:JOB_COMPLETION_INDEX MinNodes:2 Nodes:2 NodesFrom:PET_NNODES CoordHost:llm-gpu-workers-0-0.llm CoordPort:29400 CoordFrom:the JobSet hostname Nproc: RunID:k8s-llm-gpu-workers-0-0 RunsCoordinator:true}"},

	// A plain Indexed Job (kubernetes/kubernetes KEP-2214): hostname
	// <job>-<index>, JOB_COMPLETION_INDEX; a subdomain when the manifest
	// gives one (a headless Service of the same name).
	{name: "Indexed Job with a headless Service", hostname: "mnist-1", hosts: hostsFor("10.1.0.7", "mnist-1", "mnist-svc"),
		env:  []string{kube, "10.96.0.1", EnvCompletionIndex, "1", EnvPETNNodes, "2", EnvPETNprocPerNode, "cpu"},
		want: "{Workload:Indexed Job Hostname:mnist-1 Subdomain:mnist-svc NodeRank:1 RankFrom:JOB_COMPLETION_INDEX MinNodes:2 Nodes:2 NodesFrom:PET_NNODES CoordHost:mnist-0.mnist-svc CoordPort:29400 CoordFrom:the Indexed Job hostname Nproc:cpu RunID:k8s-mnist-0 RunsCoordinator:false}"},
	{name: "Indexed Job, index out of the pod", hostname: "mnist-1", hosts: hostsFor("10.1.0.7", "mnist-1", "mnist-svc"),
		env: []string{kube, "10.96.0.1", EnvCompletionIndex, "x"}, want: "error"},

	// kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go
	// (setPodEnv): with a Master replica, MASTER_ADDR/MASTER_PORT
	// (master.go), WORLD_SIZE = all replicas (pods), RANK = the replica
	// index, +1 for workers.
	{name: "PyTorchJob v1, worker 0", hostname: "pt-worker-0",
		env:  []string{kube, "10.96.0.1", EnvMasterAddr, "pt-master-0", EnvMasterPort, "23456", EnvWorldSize, "3", EnvRank, "1", "PYTHONUNBUFFERED", "0"},
		want: "{Workload:PyTorchJob Hostname:pt-worker-0 Subdomain: NodeRank:1 RankFrom:RANK MinNodes:3 Nodes:3 NodesFrom:WORLD_SIZE CoordHost:pt-master-0 CoordPort:23456 CoordFrom:MASTER_ADDR Nproc: RunID:k8s-pt-master-0 RunsCoordinator:false}"},
	// elastic.go (ElasticEnvVarGenerator): PET_RDZV_ENDPOINT
	// "<job>-worker-0:<port>", PET_NNODES "MIN:MAX", PET_NPROC_PER_NODE,
	// PET_RDZV_ID; no master, so no RANK: the pod the endpoint names runs
	// the coordinator, the others join in any order.
	{name: "PyTorchJob v1 elastic, worker 0", hostname: "el-worker-0",
		env:  []string{kube, "10.96.0.1", EnvPETRdzvEndpoint, "el-worker-0:29400", "PET_RDZV_BACKEND", "c10d", EnvPETNNodes, "2:3", EnvPETNprocPerNode, "1", EnvPETRdzvID, "el-123"},
		want: "{Workload:PyTorchJob Hostname:el-worker-0 Subdomain: NodeRank:-1 RankFrom: MinNodes:2 Nodes:3 NodesFrom:PET_NNODES CoordHost:el-worker-0 CoordPort:29400 CoordFrom:PET_RDZV_ENDPOINT Nproc:1 RunID:el-123 RunsCoordinator:true}"},
	{name: "PyTorchJob v1 elastic, worker 2", hostname: "el-worker-2",
		env:  []string{kube, "10.96.0.1", EnvPETRdzvEndpoint, "el-worker-0:29400", EnvPETNNodes, "2:3"},
		want: "{Workload:PyTorchJob Hostname:el-worker-2 Subdomain: NodeRank:-1 RankFrom: MinNodes:2 Nodes:3 NodesFrom:PET_NNODES CoordHost:el-worker-0 CoordPort:29400 CoordFrom:PET_RDZV_ENDPOINT Nproc: RunID:k8s-el-worker-0 RunsCoordinator:false}"},
	{name: "PyTorchJob, bad PET_NNODES", hostname: "el-worker-2",
		env: []string{kube, "10.96.0.1", EnvPETRdzvEndpoint, "el-worker-0:29400", EnvPETNNodes, "4:2"}, want: "error"},

	// volcano-sh/volcano pkg/controllers/job/plugins/env/types.go
	// (VK_TASK_INDEX; VC_TASK_INDEX beside it) and
	// distributed-framework/pytorch/pytorch.go: MASTER_ADDR
	// "<job>-master-0.<job>", MASTER_PORT 23456, WORLD_SIZE = the job's
	// pods, RANK 0 for the master, index+1 for workers. Worker 0's task
	// index is 0 too: RANK wins.
	{name: "Volcano with the pytorch plugin, worker 0", hostname: "vj-worker-0", hosts: hostsFor("10.1.0.12", "vj-worker-0", "vj"),
		env:  []string{kube, "10.96.0.1", EnvVCTaskIndex, "0", EnvVKTaskIndex, "0", EnvMasterAddr, "vj-master-0.vj", EnvMasterPort, "23456", EnvWorldSize, "3", EnvRank, "1"},
		want: "{Workload:Volcano Job Hostname:vj-worker-0 Subdomain:vj NodeRank:1 RankFrom:RANK MinNodes:3 Nodes:3 NodesFrom:WORLD_SIZE CoordHost:vj-master-0.vj CoordPort:23456 CoordFrom:MASTER_ADDR Nproc: RunID:k8s-vj-master-0 RunsCoordinator:false}"},
	// The svc plugin alone: VC_<TASK>_NUM (its ConfigMap, as env), the
	// pod hostname <job>-<task>-<index> under subdomain <job>.
	{name: "Volcano, one task, svc plugin", hostname: "vj-trainer-2", hosts: hostsFor("10.1.0.13", "vj-trainer-2", "vj"),
		env:  []string{kube, "10.96.0.1", EnvVCTaskIndex, "2", EnvVKTaskIndex, "2", "VC_TRAINER_NUM", "4", "VC_TRAINER_HOSTS", "vj-trainer-0.vj,vj-trainer-1.vj,vj-trainer-2.vj,vj-trainer-3.vj"},
		want: "{Workload:Volcano Job Hostname:vj-trainer-2 Subdomain:vj NodeRank:2 RankFrom:VC_TASK_INDEX MinNodes:4 Nodes:4 NodesFrom:VC_TRAINER_NUM CoordHost:vj-trainer-0.vj CoordPort:29400 CoordFrom:the Volcano hostname Nproc: RunID:k8s-vj-trainer-0 RunsCoordinator:false}"},

	// kubernetes-sigs/lws pkg/webhooks/pod_webhook.go (Default):
	// LWS_LEADER_ADDRESS "<leader>.<lws>.<namespace>", LWS_GROUP_SIZE,
	// LWS_WORKER_INDEX (0 for the leader); api/leaderworkerset/v1 names
	// them LwsLeaderAddress, LwsGroupSize, LwsWorkerIndex.
	{name: "LeaderWorkerSet worker 3", hostname: "lws-1-3",
		env:  []string{kube, "10.96.0.1", EnvLWSLeaderAddress, "lws-1.lws.default", EnvLWSGroupSize, "4", EnvLWSWorkerIndex, "3"},
		want: "{Workload:LeaderWorkerSet Hostname:lws-1-3 Subdomain: NodeRank:3 RankFrom:LWS_WORKER_INDEX MinNodes:4 Nodes:4 NodesFrom:LWS_GROUP_SIZE CoordHost:lws-1.lws.default CoordPort:29400 CoordFrom:LWS_LEADER_ADDRESS Nproc: RunID:k8s-lws-1 RunsCoordinator:false}"},
	{name: "LeaderWorkerSet leader", hostname: "lws-1",
		env:  []string{kube, "10.96.0.1", EnvLWSLeaderAddress, "lws-1.lws.default", EnvLWSGroupSize, "4", EnvLWSWorkerIndex, "0"},
		want: "{Workload:LeaderWorkerSet Hostname:lws-1 Subdomain: NodeRank:0 RankFrom:LWS_WORKER_INDEX MinNodes:4 Nodes:4 NodesFrom:LWS_GROUP_SIZE CoordHost:lws-1.lws.default CoordPort:29400 CoordFrom:LWS_LEADER_ADDRESS Nproc: RunID:k8s-lws-1 RunsCoordinator:true}"},
	{name: "LeaderWorkerSet, group size 0", hostname: "lws-1",
		env: []string{kube, "10.96.0.1", EnvLWSLeaderAddress, "lws-1.lws.default", EnvLWSGroupSize, "0", EnvLWSWorkerIndex, "0"}, want: "error"},
	{name: "bad port", hostname: "mnist-node-0-1",
		env: []string{kube, "10.96.0.1", EnvPETNNodes, "3", EnvPETNodeRank, "1", EnvPETMasterAddr, "mnist-node-0-0.mnist", EnvPETMasterPort, "99999"}, want: "error"},
}

func TestFromEnv(t *testing.T) {
	for _, tc := range fixtures {
		t.Run(tc.name, func(t *testing.T) {
			p, err := FromEnv(env(tc.env...), tc.hostname, tc.hosts)
			switch {
			case tc.want == "error":
				if !errors.Is(err, ErrPod) {
					t.Fatalf("FromEnv = %+v, %v; want an ErrPod", p, err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.want == "":
				if p != nil {
					t.Fatalf("FromEnv = %+v; want nil", p)
				}
			default:
				if p == nil {
					t.Fatalf("FromEnv = nil; want %s", tc.want)
				}
				if got := fmt.Sprintf("%+v", *p); got != tc.want {
					t.Fatalf("FromEnv = %s\nwant        %s", got, tc.want)
				}
			}
		})
	}
}

func TestApply(t *testing.T) {
	pod := func(hostname, hosts string, kv ...string) *Pod {
		t.Helper()
		p, err := FromEnv(env(append([]string{kube, "10.96.0.1"}, kv...)...), hostname, hosts)
		if err != nil || p == nil {
			t.Fatalf("FromEnv = %v, %v", p, err)
		}
		return p
	}
	js := func(i int) *Pod {
		h := fmt.Sprintf("train-workers-0-%d", i)
		return pod(h, hostsFor("10.1.0.9", h, "train"), EnvCompletionIndex, fmt.Sprint(i), EnvPETNNodes, "2:3")
	}
	show := func(c launcher.Config) string {
		r := "nil"
		if c.NodeRank != nil {
			r = fmt.Sprint(*c.NodeRank)
		}
		return fmt.Sprintf("nodes=%d:%d coordinator=%q listen=%q rank=%s run=%s scheduled=%v", c.MinNodes, c.Nodes, c.Coordinator, c.CoordinatorListen, r, c.RunID, c.Scheduled)
	}
	for _, tc := range []struct {
		name  string
		p     *Pod
		given map[string]bool
		want  string // show(cfg), or "error: TEXT" for an ErrPod containing TEXT
	}{
		{"coordinator pod", js(0), nil, `nodes=2:3 coordinator="" listen="0.0.0.0:29400" rank=0 run=k8s-train-workers-0-0 scheduled=true`},
		{"joiner", js(2), nil, `nodes=2:3 coordinator="train-workers-0-0.train:29400" listen="0.0.0.0:29400" rank=2 run=k8s-train-workers-0-0 scheduled=true`},
		{"flags win", js(2), map[string]bool{"nnodes": true, "coordinator": true, "node-rank": true, "run-id": true}, `nodes=0:0 coordinator="" listen="" rank=nil run= scheduled=true`},
		{"no node count", pod("mnist-1", hostsFor("10.1.0.7", "mnist-1", "svc"), EnvCompletionIndex, "1"), nil, "error: set PET_NNODES"},
		{"no node count, --nnodes given", pod("mnist-1", hostsFor("10.1.0.7", "mnist-1", "svc"), EnvCompletionIndex, "1"), map[string]bool{"nnodes": true}, `nodes=0:0 coordinator="" listen="" rank=1 run=k8s-mnist-0 scheduled=true`},
		{"no subdomain, no master", pod("mnist-1", "", EnvCompletionIndex, "1", EnvPETNNodes, "2"), nil, "error: give the pod template a subdomain"},
		{"one pod needs no coordinator address", pod("mnist-0", "", EnvCompletionIndex, "0", EnvPETNNodes, "1"), nil, `nodes=1:1 coordinator="" listen="" rank=0 run= scheduled=true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg launcher.Config
			err := tc.p.Apply(&cfg, tc.given)
			if text, ok := strings.CutPrefix(tc.want, "error: "); ok {
				if !errors.Is(err, ErrPod) || !strings.Contains(err.Error(), text) {
					t.Fatalf("Apply = %v; want an ErrPod saying %q", err, text)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := show(cfg); got != tc.want {
				t.Fatalf("Apply: %s\nwant   %s", got, tc.want)
			}
		})
	}
	var nilPod *Pod
	var cfg launcher.Config
	if err := nilPod.Apply(&cfg, nil); err != nil || cfg.Scheduled {
		t.Fatalf("a nil Pod's Apply = %v, changed %+v", err, cfg)
	}
}

func TestSubdomain(t *testing.T) {
	for _, tc := range []struct{ hosts, hostname, want string }{
		{hostsFor("10.0.0.1", "a-0", "svc"), "a-0", "svc"},
		{hostsFor("10.0.0.1", "a-0", "svc"), "a", ""}, // a prefix of another pod's name
		{"127.0.0.1 localhost\n10.0.0.1 a-0 # no FQDN\n", "a-0", ""},
		{"10.0.0.1 a-0.svc.ns.svc.cluster.local a-0 # comment\n", "a-0", "svc"},
		{"", "a-0", ""},
	} {
		if got := Subdomain(tc.hosts, tc.hostname); got != tc.want {
			t.Errorf("Subdomain(%q, %q) = %q; want %q", tc.hosts, tc.hostname, got, tc.want)
		}
	}
}

func FuzzFromEnv(f *testing.F) {
	f.Add("mnist-node-0-1", "3", "1", "mnist-node-0-0.mnist", "29400", "1")
	f.Add("train-workers-0-2", "2:4", "", "", "", "2")
	f.Fuzz(func(t *testing.T, hostname, nnodes, rank, addr, port, index string) {
		p, err := FromEnv(env(kube, "x", EnvPETNNodes, nnodes, EnvPETNodeRank, rank, EnvPETMasterAddr, addr, EnvPETMasterPort, port, EnvCompletionIndex, index),
			hostname, hostsFor("10.0.0.1", hostname, "train"))
		if err != nil && !errors.Is(err, ErrPod) {
			t.Fatalf("FromEnv: %v, not an ErrPod", err)
		}
		if p != nil {
			var cfg launcher.Config
			if err := p.Apply(&cfg, nil); err != nil && !errors.Is(err, ErrPod) {
				t.Fatalf("Apply: %v, not an ErrPod", err)
			}
		}
	})
}
