package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/gotrain/gotrain/internal/torchrun"
	"github.com/gotrain/gotrain/launcher"
)

type torchrunCmd struct{}

func (*torchrunCmd) name() string { return "torchrun" }
func (*torchrunCmd) synopsis() string {
	return "run a PyTorch program with torchrun's command line (also as a symlink named torchrun)"
}

const torchrunUsage = `
Usage: gotrain torchrun [torchrun's flags] SCRIPT.py [ARGS...]
       gotrain torchrun [flags] -m MODULE [ARGS...]
       gotrain torchrun [flags] --no-python PROGRAM [ARGS...]

Takes torchrun's command line as it is and runs it as gotrain launch: both
spellings (--nproc_per_node, --nproc-per-node), --flag=value and --flag
value, PET_* variables as defaults. Workers see torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT, ...).
Installed as a symlink named torchrun, gotrain behaves the same.

--node-rank 0 starts the coordinator (group rank 0, MASTER_ADDR); another
node rank places the node after it in that order (gotrain launch --node-rank).

Accepted without effect, with a note each: --rdzv-backend, --rdzv-conf,
--redirects, --tee,
--local-ranks-filter (every rank's output is printed, prefixed [rank N]),
--monitor-interval, --start-method, --role, --local-addr, --run-path,
--logs-specs. Any other flag is an error. For gotrain's own flags (--standby,
--hang-timeout, ...) use gotrain launch.

Examples:
  gotrain torchrun --nproc_per_node=2 --standalone train.py --epochs 3
  gotrain torchrun --nproc_per_node=gpu -m mypkg.train --lr 0.1
  gotrain torchrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 train.py
`

func (c *torchrunCmd) run(ctx context.Context, args []string) error {
	return runTorchrun(ctx, args, os.Stdout, os.Stderr)
}

func runTorchrun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fs := torchrunFlags()
		fs.SetOutput(stdout)
		fs.Usage()
		return flag.ErrHelp
	}
	gpus := launcher.FindGPUs()
	r, err := torchrun.Map(args, torchrun.Machine{GPUs: gpus.N, GPUsHow: gpus.How, CPUs: runtime.NumCPU(), Getenv: os.Getenv})
	if err != nil {
		if errors.Is(err, torchrun.ErrUsage) {
			msg := strings.TrimPrefix(err.Error(), torchrun.ErrUsage.Error()+": ")
			hint := "torchrun's flags come before the script; the script's own after it."
			if m := undefinedFlag.FindStringSubmatch(msg); m != nil { // help.go
				msg = "unknown flag --" + m[1]
				if near := nearestFlag(torchrunFlags(), m[1]); near != "" {
					hint = fmt.Sprintf("Did you mean --%s? %s", near, hint)
				}
			}
			return &usageError{msg: msg, hint: hint}
		}
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintf(stderr, "gotrain torchrun: note: %s\n", n)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(stderr, "gotrain torchrun: warning: %s\n", w)
	}
	return (&launchCmd{}).run(ctx, r.LaunchArgs)
}

// torchrunFlags documents the flags for --help; torchrun.Map parses them
// (both spellings, PET_* defaults), not this FlagSet.
func torchrunFlags() *flag.FlagSet {
	fs := newFlagSet("torchrun", torchrunUsage)
	setGroupedUsage(fs, torchrunUsage, torchrunGroups, "") // help.go
	fs.String("nproc-per-node", "1", "`N|auto|gpu|cpu`: the workers on this node: N, auto (the GPUs, else the CPUs), gpu (the GPUs: an error without them) or cpu; without enough GPUs, gotrain's CPU backend, with a warning")
	fs.Bool("standalone", false, "one node with its own coordinator (rendezvous flags have no effect)")
	fs.String("nnodes", "1", "`N|MIN:MAX`: nodes: N, or MIN:MAX (elastic)")
	fs.String("rdzv-endpoint", "", "HOST:PORT of gotrain's coordinator (with --node-rank 0: listen at PORT)")
	fs.String("master-addr", "", "with --master-port and no --rdzv-endpoint: the coordinator's host")
	fs.String("master-port", "", "with --master-addr: the coordinator's port")
	fs.String("node-rank", "", "0: this node starts the coordinator (group rank 0); others: the node's place after it (gotrain launch --node-rank)")
	fs.String("rdzv-id", "", "the run id (TORCHELASTIC_RUN_ID)")
	fs.Int("max-restarts", 0, "restarts after a worker fails")
	fs.String("log-dir", "", "each rank's log in DIR/RUN_ID/attempt-N")
	fs.String("signals-to-handle", "", "SIGTERM and SIGINT always stop the workers; SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 are passed on")
	fs.Bool("module", false, "run a module: python3 -u -m MODULE (also -m)")
	fs.Bool("no-python", false, "run the program itself, not through python3")
	return fs
}
