// Command kube-apiserver is Kubernetes' API server, built from the
// k8s.io/kubernetes module for gotrain's end-to-end test on a real control
// plane (internal/testing/k8stest/e2e; `make e2e-kubernetes`).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
