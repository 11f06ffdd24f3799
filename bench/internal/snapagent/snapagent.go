// Package snapagent is the benchmarks' stand-in for gotrain's agent on the
// snapshot socket: the benchmark binary re-executes itself with -agent, as
// the agent is another process than the worker, so that the memfd really
// crosses processes (bench/memstate, bench/gpusnap).
package snapagent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gotrain/gotrain/internal/memsnap"
)

// Token is the job token the benchmarks' agent and worker share.
const Token = "bench-token"

// Serve serves the snapshot socket at path until the process is killed
// (the -agent side).
func Serve(path string) {
	lis, err := memsnap.Listen(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = (&memsnap.Server{Store: memsnap.NewStore(0), Token: Token}).Serve(context.Background(), lis)
}

// Start runs this binary again as the agent (with -agent SOCKET) and
// returns a client of it and stop, which closes the client, ends the
// agent and removes its directory.
func Start() (*memsnap.Client, func(), error) {
	tmp, err := os.MkdirTemp("", "snapagent-bench-")
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(tmp, memsnap.SocketName)
	agent := exec.Command(os.Args[0], "-agent", sock)
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	end := func() { _ = agent.Process.Kill(); _ = agent.Wait(); os.RemoveAll(tmp) }
	var c *memsnap.Client
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = memsnap.Dial(context.Background(), sock, Token, 0); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		end()
		return nil, nil, fmt.Errorf("the benchmark's agent did not answer within 30 s: %w", err)
	}
	return c, func() { c.Close(); end() }, nil
}
