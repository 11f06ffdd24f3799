// Package kubernetes makes `gotrain launch` (and `gotrain torchrun`, which
// runs it) zero-flag inside a Kubernetes pod, as package slurm does inside
// srun: FromEnv reads the pod's place in its job from the variables and
// hostname that the workload's controller gave it, and Apply turns that
// into the agent's settings where the command line left them out. It is
// pure: the environment, hostname and /etc/hosts come in as values.
//
// The workloads and what their controllers set (the fixtures in
// pod_test.go cite the source of each):
//
//   - Kubeflow Trainer v2 (TrainJob; its Torch plugin): PET_NNODES,
//     PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index, through
//     the downward API), PET_MASTER_ADDR (<trainjob>-node-0-0.<trainjob>)
//     and PET_MASTER_PORT (29400);
//   - JobSet: every pod is an Indexed Job's (JOB_COMPLETION_INDEX), its
//     hostname <jobset>-<replicatedjob>-<job>-<pod> and its subdomain the
//     headless Service (the JobSet's name by default): the coordinator is
//     pod 0-0 of the first replicated job found in the hostname;
//   - Indexed Job: JOB_COMPLETION_INDEX, hostname <job>-<index>; with a
//     subdomain, the coordinator is <job>-0.<subdomain>;
//   - PyTorchJob (Kubeflow training-operator v1): MASTER_ADDR, MASTER_PORT,
//     WORLD_SIZE and RANK that count pods (master 0, worker i is i+1); with
//     an elastic policy PET_RDZV_ENDPOINT, PET_NNODES (MIN:MAX),
//     PET_NPROC_PER_NODE, PET_RDZV_ID, PET_MAX_RESTARTS;
//   - Volcano Job: VC_TASK_INDEX and VK_TASK_INDEX (env plugin), its
//     pytorch plugin's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK
//     (pods again); without that plugin, VC_<TASK>_NUM from the svc plugin;
//   - LeaderWorkerSet: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX.
//
// Nothing is detected outside a pod (no KUBERNETES_SERVICE_HOST, which
// the kubelet sets in every container) or with GOTRAIN_KUBERNETES=off.
//
// # Usage
//
//	pod, err := kubernetes.FromEnv(os.Getenv, hostname, hostsFile)
//	pod.Apply(&cfg, flagsGiven) // nil pod: changes nothing
//
// PID 1 duties (reaping, signals) are InitAsPID1's (pid1.go).
package kubernetes
