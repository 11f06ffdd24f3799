// Command kube-controller-manager is Kubernetes' controller manager (the
// test runs its Job and garbage-collector controllers), built from the
// k8s.io/kubernetes module for gotrain's end-to-end test
// (internal/testing/k8stest/e2e; `make e2e-kubernetes`).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
