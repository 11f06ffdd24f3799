// Command gotrain runs data-parallel training jobs: `gotrain launch` starts
// one worker per GPU (or per CPU rank) on this node and supervises them.
// Run `gotrain help` for the commands.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/kubernetes"
)

func main() {
	closeInheritedOnExec()                // fds.go
	if kubernetes.InitWanted(os.Getenv) { // a container's entrypoint: reap and pass signals on (pid1.go)
		self, err := os.Executable()
		if err != nil {
			self = "/proc/self/exe"
		}
		os.Exit(kubernetes.RunInit(self, os.Args, os.Environ(), os.Stderr))
	}
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "torchrun" { // a symlink named torchrun
		args = append([]string{"torchrun"}, args...)
	}
	os.Exit(run(context.Background(), args))
}
