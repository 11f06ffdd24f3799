package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/kubernetes"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher"
)

// Inside a Kubernetes pod of a training job (cmd/gotrain/internal/kubernetes), gotrain
// launch takes the node count, node rank, coordinator, run id and workers
// per node from the pod's variables, as it does from Slurm's; flags win.

// podTokenFile is where a pod's job token is looked for when neither
// --job-token-file nor $GOTRAIN_JOB_TOKEN gives one: a Secret mounted at
// /var/run/secrets/gotrain with defaultMode 0400.
const podTokenFile = "/var/run/secrets/gotrain/token"

// detectPod reads this process's pod; nil outside one (or with
// GOTRAIN_KUBERNETES=off). Its PET_NPROC_PER_NODE becomes the
// --nproc-per-node word when neither --nproc-per-node nor --gpus is given.
func detectPod(getenv func(string) string, nprocWord *string, cfg *launcher.Config, given map[string]bool) (*kubernetes.Pod, error) {
	hostname, _ := os.Hostname()
	hosts, _ := os.ReadFile("/etc/hosts")
	pod, err := kubernetes.FromEnv(getenv, hostname, string(hosts))
	if err != nil {
		return nil, &usageError{msg: err.Error(), hint: "Fix the pod template's variables, pass the flags they would give (--nnodes, --node-rank, --coordinator), or set " + kubernetes.EnvOff + "=off to ignore Kubernetes."}
	}
	if pod != nil && pod.Nproc != "" && !given["nproc-per-node"] && !given["gpus"] && cfg.NprocPerNode == 0 && *nprocWord == "" {
		f := &nprocFlag{n: &cfg.NprocPerNode, word: nprocWord}
		if err := f.Set(pod.Nproc); err != nil {
			return nil, &usageError{msg: fmt.Sprintf("%s=%q: %v", kubernetes.EnvPETNprocPerNode, pod.Nproc, err), hint: "Give N, auto, gpu or cpu."}
		}
	}
	return pod, nil
}

// applyPod gives cfg the pod's settings and, for a job of several pods,
// the job token: every pod must hold the same one, from a Secret.
func applyPod(pod *kubernetes.Pod, cfg *launcher.Config, given map[string]bool, verbose bool, stderr io.Writer) error {
	if pod == nil {
		return nil
	}
	if err := pod.Apply(cfg, given); err != nil {
		hint := "Set it in the pod template, pass the flag, or set " + kubernetes.EnvOff + "=off to ignore Kubernetes."
		return &usageError{msg: strings.TrimPrefix(err.Error(), kubernetes.ErrPod.Error()+": "), hint: hint}
	}
	if (cfg.Nodes > 1 || cfg.MinNodes > 1) && cfg.JobToken == "" {
		tok, err := readJobTokenFile(podTokenFile)
		var ue *usageError
		switch {
		case err == nil:
			cfg.JobToken = tok
		case errors.Is(err, os.ErrNotExist) || errors.As(err, &ue) && strings.Contains(ue.msg, "no such file"):
			return &usageError{msg: fmt.Sprintf("this %s pod is one of %d, and they need one job token: none was given", pod.Workload, cfg.Nodes),
				hint: "Make a Secret once (kubectl create secret generic gotrain-token --from-literal=token=$(openssl rand -hex 32)) and give every pod of the job its key:\n" +
					"      env:\n      - name: " + jobenv.JobToken + "\n        valueFrom: {secretKeyRef: {name: gotrain-token, key: token}}\n" +
					"  or mount it: volumes: [{name: gotrain-token, secret: {secretName: gotrain-token, defaultMode: 0400}}] and\n" +
					"      volumeMounts: [{name: gotrain-token, mountPath: /var/run/secrets/gotrain, readOnly: true}]\n" +
					"  (examples/kubernetes/ has whole manifests)."}
		case errors.As(err, &ue):
			ue.hint = "Mount the Secret with defaultMode: 0400, or give the token in $" + jobenv.JobToken + " (secretKeyRef)."
			return ue
		default:
			return err
		}
	}
	if verbose {
		fmt.Fprintln(stderr, "gotrain: "+pod.Summary(cfg))
	}
	return nil
}
