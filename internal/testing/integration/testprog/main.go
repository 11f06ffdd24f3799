// Command testprog is the worker program gotrain's integration tests launch.
// Each mode exercises one thing a real training program does or suffers:
//
//	collectives [--max N]   check every collective, dtype and op exactly
//	exit --rank R --code C  rank R exits with C; the others wait to be stopped
//	sleep --pid-dir DIR     write the pid (and a child's) to DIR, then sleep
//	env                     print the job's environment variables
//	signals --pid-dir DIR   print the signals it gets; SIGINT/SIGTERM end it
//	restart --mark FILE     rank 1 dies once; time the restart (restart.go)
//	hang --fault F          a training loop where one rank misbehaves at one step (hang.go)
//	plain --go FILE         rank 1 exits once FILE exists; no worker library (plain.go)
//	closeout --code C       close stdout and stderr, run on a while, then exit with C
//	peekparent              try to read the agent's memory (/proc/PPID/mem) (peek.go)
//	flood --n N --dir DIR   rank 0 holds N long polls through the agent, rank 1 then crashes (flood.go)
//
// Started as a hot standby (gotrain launch --standby), every mode first
// prints "standby pid=P slot=S unix_ns=T".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/worker"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testprog collectives|exit|sleep|env [flags]")
		os.Exit(2)
	}
	ctx := context.Background()
	if os.Getenv("GOTRAIN_STANDBY") == "1" {
		fmt.Printf("standby pid=%d slot=%s unix_ns=%d\n", os.Getpid(), os.Getenv("GOTRAIN_STANDBY_SLOT"), time.Now().UnixNano())
	}
	var err error
	switch mode, args := os.Args[1], os.Args[2:]; mode {
	case "collectives":
		err = collectives(ctx, args)
	case "hang":
		err = hangMode(ctx, args)
	case "exit":
		err = exitMode(ctx, args)
	case "sleep":
		err = sleepMode(args)
	case "signals":
		err = signalsMode(args)
	case "restart":
		err = restartMode(ctx, args)
	case "dataparallel":
		err = dataParallelMode(ctx, args)
	case "plain":
		err = plainMode(args)
	case "closeout":
		err = closeoutMode(args)
	case "peekparent":
		err = peekParentMode()
	case "flood":
		err = floodMode(args)
	case "env":
		for _, kv := range os.Environ() {
			if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "GOTRAIN_") || strings.HasPrefix(name, "TORCHELASTIC_") ||
				strings.Contains(" RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT NCCL_NVLS_ENABLE ", " "+name+" ") {
				fmt.Println(kv)
			}
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprog:", err)
		os.Exit(1)
	}
}

func exitMode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("exit", flag.ExitOnError)
	rank := fs.Int("rank", 0, "rank that exits")
	code := fs.Int("code", 1, "its exit status")
	_ = fs.Parse(args)
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	if w.Rank == *rank {
		fmt.Fprintf(os.Stderr, "rank %d restart count %d (TORCHELASTIC_RESTART_COUNT=%s)\n", w.Rank, w.RestartCount, os.Getenv("TORCHELASTIC_RESTART_COUNT"))
		fmt.Fprintf(os.Stderr, "rank %d exiting with %d on purpose\n", w.Rank, *code)
		os.Exit(*code)
	}
	time.Sleep(time.Hour) // stopped by the agent
	return nil
}

func sleepMode(args []string) error {
	fs := flag.NewFlagSet("sleep", flag.ExitOnError)
	dir := fs.String("pid-dir", "", "directory for pid files")
	ignoreTerm := fs.Bool("ignore-term", false, "ignore SIGTERM")
	_ = fs.Parse(args)
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	// A child of the worker, to show that the whole process group goes.
	child := exec.Command("sleep", "3600")
	if err := child.Start(); err != nil {
		return err
	}
	rank := os.Getenv("GOTRAIN_RANK")
	for name, pid := range map[string]int{"worker": os.Getpid(), "child": child.Process.Pid} {
		p := filepath.Join(*dir, fmt.Sprintf("%s-%s.pid", name, rank))
		if err := os.WriteFile(p+".tmp", []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	fmt.Println("sleeping")
	time.Sleep(time.Hour)
	return nil
}

// closeoutMode closes its output pipes and runs on before it exits with
// --code: the agent sees the pipes' EOF while the process is alive, which
// must not pass for its exit (internal/launcher/exitearly.go).
func closeoutMode(args []string) error {
	fs := flag.NewFlagSet("closeout", flag.ExitOnError)
	code := fs.Int("code", 4, "exit status")
	after := fs.Duration("after", time.Second, "how long to run on after closing the output")
	_ = fs.Parse(args)
	fmt.Println("closing stdout and stderr")
	_ = syscall.Close(1)
	_ = syscall.Close(2)
	time.Sleep(*after)
	os.Exit(*code)
	return nil
}
