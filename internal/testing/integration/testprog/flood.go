package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// floodMode is a compromised (or runaway) worker beside a crashing one. In
// the first attempt rank 0 holds --n long polls through its agent — KVGets
// of a key that never comes, each polled again as it returns — and prints
// how many the agent refused, with the first refusal, then writes
// --dir/flooded and polls on until it is stopped; rank 1 waits for that
// file and exits 1. Later attempts print and exit 0.
func floodMode(args []string) error {
	fs := flag.NewFlagSet("flood", flag.ExitOnError)
	n := fs.Int("n", 2500, "long polls rank 0 holds")
	dir := fs.String("dir", "", "where rank 0 says the flood is in place")
	_ = fs.Parse(args)
	v, err := jobenv.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	mark := filepath.Join(*dir, "flooded")
	switch {
	case v.RestartCount > 0:
		fmt.Printf("flood rank=%d restart=%d done\n", v.Rank, v.RestartCount)
		return nil
	case v.Rank != 0:
		for {
			if _, err := os.Stat(mark); err == nil {
				fmt.Printf("flood rank=%d crashes\n", v.Rank)
				os.Exit(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	conn, err := grpc.NewClient("unix://"+v.AgentSocket, grpc.WithTransportCredentials(insecure.NewCredentials()), token.DialOption(v.JobToken))
	if err != nil {
		return err
	}
	agent := gotrainv1.NewAgentClient(conn)
	var refused atomic.Int64
	var first sync.Once
	for range *n {
		go func() {
			for {
				_, err := agent.KVGet(context.Background(), &gotrainv1.KVGetRequest{Key: "flood/never", WaitMs: time.Hour.Milliseconds()})
				if status.Code(err) == codes.ResourceExhausted {
					refused.Add(1)
					first.Do(func() { fmt.Printf("flood refusal: %s\n", status.Convert(err).Message()) })
					return
				}
				if err != nil {
					time.Sleep(100 * time.Millisecond) // the agent stops us
				}
			}
		}()
	}
	// The refusals come at once; without any (no budget), the crash
	// follows after a while anyway.
	for deadline := time.Now().Add(30 * time.Second); refused.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the rest of the refusals
	fmt.Printf("flood rank=0 polls=%d refused=%d\n", *n, refused.Load())
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		return err
	}
	select {} // polling until the agent stops this worker
}
