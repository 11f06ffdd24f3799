// Command gotrain runs data-parallel training jobs: `gotrain launch` starts
// one worker per GPU (or per CPU rank) on this node and supervises them.
// Run `gotrain help` for the commands.
package main

import (
	"context"
	"os"
	"path/filepath"
)

func main() {
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "torchrun" { // a symlink named torchrun
		args = append([]string{"torchrun"}, args...)
	}
	os.Exit(run(context.Background(), args))
}
