// Command etcd is the API server's store, built from the etcd server module
// for gotrain's end-to-end test on a real control plane
// (internal/testing/k8stest/e2e; `make e2e-kubernetes`). It is a module of its
// own: etcd's gRPC is newer than the API server's.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
