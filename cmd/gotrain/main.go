// Command gotrain runs data-parallel training jobs: `gotrain launch` starts
// one worker per GPU (or per CPU rank) on this node and supervises them.
// Run `gotrain help` for the commands.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:]))
}
