package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/kubernetes"
	"github.com/gotrain/gotrain/cmd/gotrain/internal/slurm"
	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/placement"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/launcher/signals"
	"github.com/gotrain/gotrain/internal/pyinterp"
	"github.com/gotrain/gotrain/nccl"
)

type launchCmd struct{}

func (*launchCmd) name() string { return "launch" }
func (*launchCmd) synopsis() string {
	return "run a training program on this node's GPUs (or CPU ranks)"
}

const launchUsage = `
Usage: gotrain launch [flags] -- PROGRAM [ARGS...]

Starts one worker process per GPU (or per CPU rank with --backend cpu) on
this node and supervises them: each line is prefixed "[rank N]", a failed
worker restarts every worker (--max-restarts, one line says so), and
Ctrl-C stops them all. Workers get torchrun's variables (RANK, LOCAL_RANK,
WORLD_SIZE, ...); gotrain torchrun takes torchrun's command line as it is.

Examples:
  gotrain launch --nproc-per-node 2 --backend cpu -- train.py --epochs 3
  srun gotrain launch -- ./train          # in an sbatch script: nothing else to pass
  gotrain launch --gpus 8 -- ./train --epochs 3
  gotrain launch --nproc-per-node 4 --backend cpu -- ./bin/mnist
  gotrain launch --gpus 8 --standby=off -- ./train   # no spare processes (GPU memory is tight)
  gotrain launch --nnodes 2:4 --nproc-per-node 2 --backend cpu --preflight quick -- ./train  # a slow node is left out
  # two nodes: the first starts the coordinator and prints the second's command
  gotrain launch --nnodes 2 --gpus 8 -- ./train
  export GOTRAIN_JOB_TOKEN=$(cat TOKEN_FILE)   # the file the first node named
  gotrain launch --nnodes 2 --gpus 8 --coordinator 10.0.0.1:29400 --ca-hash sha256:HEX -- ./train

Values: --nproc-per-node takes N, auto (one worker per GPU, or per CPU
without GPUs), gpu (one per GPU: an error without them) or cpu (one per CPU
core, on the CPU backend), as torchrun's does. Durations need a unit: 500ms,
30s, 10m, 1h. Flags may be spelled with underscores too (--nproc_per_node).
`

// launchShortUsage heads gotrain launch --help, which shows launchShort's
// flags; --help-all shows launchUsage, every flag and launchDetails.
const launchShortUsage = `
Usage: gotrain launch [flags] -- PROGRAM [ARGS...]

Starts one worker per GPU (or CPU rank) on this node, with torchrun's
variables, and supervises them: output prefixed "[rank N]", a failed
worker restarts every worker, Ctrl-C stops them all, none outlives gotrain.

Examples:
  gotrain launch --nproc-per-node 2 --backend cpu -- train.py --epochs 3
  gotrain launch --gpus 8 -- ./train --epochs 3
  srun gotrain launch -- ./train          # in an sbatch script: nothing else to pass
  # two nodes: the first starts the coordinator and prints the second's command
  gotrain launch --nnodes 2 --gpus 8 -- ./train
`

var launchShort = []string{"nproc-per-node", "gpus", "backend", "nnodes", "max-restarts", "standby", "log-dir"}

// launchDetails follows the flags in gotrain launch --help-all.
const launchDetails = `
Details:

Starts one worker process per GPU (or per CPU rank with --backend cpu), each
with its rank in GOTRAIN_* and torchrun-compatible variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_ERROR_FILE; OMP_NUM_THREADS=1 with more than one worker when it
is unset, as torchrun), and supervises them: output is prefixed "[rank N]", the exit status is the first failing
worker's, Ctrl-C and SIGTERM reach every worker, and no worker outlives
gotrain. Ctrl-C or SIGTERM stops gotrain whatever it waits for (the
coordinator, the other nodes, a restart): workers get --grace-period, a
second signal kills them at once, the exit status is 130 (SIGINT) or 143
(SIGTERM) and the last line says what gotrain was waiting for.

When a worker fails, every worker of the generation is stopped (SIGTERM,
--grace-period, SIGKILL) and the next generation starts, up to --max-restarts
times (default 3), with one line that says so ("gotrain: rank 1 on node3
exited 1 (ImportError: No module named 'foo'): restarting all 8 ranks,
attempt 2 of 4, in 0 s"); workers see the count in GOTRAIN_RESTART_COUNT
and TORCHELASTIC_RESTART_COUNT. A failure that can only repeat is not
retried unless --retry-permanent is given, and the report says so: the
program cannot be executed (not found, exec format error, permission
denied), or a Python program ends with ImportError, ModuleNotFoundError or
SyntaxError before any rank made progress. A failure that repeats before any rank made
progress (no step reported, no collective completed) waits longer each
time: 1s more after the second, 2s after the third, ... up to 30s, on top
of --restart-backoff; the report then says "the same failure N times".
Go workers that run worker.Run recover in
process instead: only the failed rank's process starts again. When the
restarts are spent, gotrain prints the root cause (rank, host, exit code or
signal, OOM kill, GPU XID errors, the last lines of stderr), writes it to
root-cause.json in the run's log dir with --log-dir (DIR/RUN_ID/attempt-N,
a directory of its own per run; a run that succeeds says so there), and
exits with the failed rank's status.

Hot standbys are spare processes, one per GPU (or CPU rank), started and
warmed up: a Go program's worker.Init loads the CUDA driver, the GPU's
primary context and NCCL's kernels, then waits. A rank that needs a new process
(every rank after a restart, the failed rank after an in-process recovery)
takes over its GPU's standby instead of starting from scratch (on 2 × H200:
0.55–0.75 s from a crash to every rank's first collective instead of
~1.4 s), and a new standby starts behind it. A standby prints under
"[standby N]" until it has a rank, holds a CUDA context (GPU memory) on
its GPU, and never fails the job by itself. For Go programs,
--standby=auto (the default) starts them with --backend nccl once every
worker of the node has attached with the worker library;
--standby (=on) starts them at once on any backend, and a program that
never calls worker.Init then gets a warning and ranks start as without;
--standby=off never.

Python programs (python[3] [options] SCRIPT, python -m MODULE, SCRIPT.py)
get Python standbys under --standby=auto or on, on any backend (none
with --max-restarts 0, which never needs a new process): the same
interpreter with the same options, which has imported torch,
torch.distributed and --standby-preload's modules and, on a GPU, made
its CUDA context (` + pyStandbyGPUMemory + ` of GPU memory per standby). A rank that
takes one over gets exactly a fresh worker's environment, sys.argv,
sys.path[0], working directory and signal handlers, and runs the program
as __main__ as python would (on one H200: 0.44–0.53 s from a crash to
the first all-reduce, torchrun 4.4–5.2 s). An interpreter option that
cannot be pre-warmed (-c, -i, stdin), or a standby that cannot import
torch or a preload module, gives one warning and ranks start fresh
interpreters.

Each standby also holds about one rank's host memory (its RSS; a CPU
torch rank: ~230 MB), so --standby=auto first checks, once the ranks run
(for Python programs, 2 s after they start), that the node's
MemAvailable holds the ranks' RSS once more with 10% of the node's
memory (at least 1 GiB) to spare; where it does not, one line says what
is needed and what is available, and no standby starts. --standby=on
starts them whatever the memory.

Under Slurm (inside srun) the node count, this node's rank and the
coordinator (on the step's first node, at a port from the job and step id)
come from SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST,
SLURM_STEP_NUM_NODES, SLURM_NODEID, SLURM_LOCALID and
SLURM_STEP_TASKS_PER_NODE; the job token and CA hash travel over munge,
never printed. With several tasks per node, SLURM_LOCALID 0 runs one
worker per task and the others wait. The restart count starts at
SLURM_RESTART_COUNT (a requeued job counts on); --grace-period is cut to
fit in slurm.conf's KillWait; Slurm itself delivers --signal and scancel
--signal to every worker (--signals-to-handle chooses what the agent
passes on outside Slurm). Flags win; GOTRAIN_SLURM=off ignores Slurm.
README: "Under Slurm".

In a Kubernetes pod of a Kubeflow TrainJob, JobSet, Indexed Job,
PyTorchJob, Volcano Job or LeaderWorkerSet, the node count, node rank,
coordinator (the first pod, by its DNS name) and run id come from the
variables and hostname the controller gave the pod (PET_NNODES,
PET_NODE_RANK, PET_MASTER_ADDR, JOB_COMPLETION_INDEX, LWS_*,
VC_TASK_INDEX, MASTER_ADDR/WORLD_SIZE/RANK, ...), workers per node from
PET_NPROC_PER_NODE; every pod takes the job token from a Secret
($GOTRAIN_JOB_TOKEN or /var/run/secrets/gotrain/token). As the
container's entrypoint (PID 1), gotrain reaps orphans and passes signals
on. Flags win; GOTRAIN_KUBERNETES=off ignores Kubernetes. README: "Under
Kubernetes".

A PROGRAM ending in .py runs with the interpreter gotrain torchrun would
choose, and gotrain says which and why once: $PYTHON_EXEC; else, when the
script imports torch, the interpreter of PyTorch's torchrun on PATH or PATH's
python3, whichever has torch (none is an error saying what to set); else
PATH's python3. -- python3 SCRIPT.py runs that python3 as given.
torchrun's own flags (--standalone, --master_port, -m, ...) are answered
with the same command line for gotrain torchrun, which takes it whole.

Preflight (--preflight): before it joins, a node proves itself — quick by
default on a multi-node GPU job, in a few seconds. A node that fails prints
one line per failed check ("gotrain: preflight: node gpu07 failed
pcie-link: measured ..., expected ...; fix: ..."; under Slurm with the
--exclude=HOST to submit again with) and is written into this machine's
health record ($XDG_STATE_HOME/gotrain/node-health.jsonl, gotrain doctor
--history). Under --nnodes MIN:MAX it stays out and the job starts without
it; a machine that failed twice within 24 h stays out of such jobs for 6 h.
Otherwise (a fixed --nnodes, or the node that runs the coordinator) the job
fails before any step and every node exits with status 4.

Every connection to the coordinator is TLS. The node that starts it makes a
job CA (in memory) and prints its hash; a joining node verifies the
coordinator by --ca-hash before it sends the job token, and gets a
certificate of its own at Join, so that it can act only for itself.
`

// reaperArg makes `gotrain launch` the agent's orphan reaper instead
// (launcher.RunReaper): started by the agent, never by people.
const reaperArg = "_reaper"

// pyStandbyGPUMemory is what a Python standby's CUDA context takes of its
// GPU (bench/results/torch-restart-standby-2026-12-01-h200.md).
const pyStandbyGPUMemory = "about 520 MiB on an H200 with torch 2.11"

func (c *launchCmd) run(ctx context.Context, args []string) (retErr error) {
	if len(args) == 1 && args[0] == reaperArg {
		return launcher.RunReaper(os.Stdin)
	}
	if err := keepMemoryPrivate(); err != nil { // nodump.go: before the token and keys are read
		return err
	}
	var cfg launcher.Config
	var opts launchOpts
	fs := launchFlags(&cfg, &opts)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if opts.logFormat == logJSON { // every line from here on one JSON object (logjson.go)
		end, err := jsonConsole(hostnameOr("?"))
		if err != nil {
			return err
		}
		defer func() { retErr = end(retErr) }()
	}
	handle, err := slurm.ParseSignals(opts.signals)
	if err != nil {
		return &usageError{msg: err.Error(), hint: "Give a comma-separated list of SIGUSR1, SIGUSR2, SIGHUP and SIGQUIT (e.g. --signals-to-handle SIGUSR1,SIGUSR2), or none."}
	}
	if err := applyJobToken(fs, &cfg.JobSettings, os.Stderr); err != nil { // jobtoken.go
		return err
	}
	if fs.NArg() == 0 {
		return &usageError{msg: "no program given", hint: "Put the program after `--`: gotrain launch --nproc-per-node 2 --backend cpu -- ./train"}
	}
	if err := cfg.JobSettings.Validate(); err != nil {
		return settingsUsageError(err) // coordinator.go
	}
	cfg.JobFlagsGiven = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { cfg.JobFlagsGiven[f.Name] = true })
	pod, err := detectPod(os.Getenv, &opts.nprocWord, &cfg, cfg.JobFlagsGiven) // kubernetes.go: in a pod of a training job
	if err != nil {
		return err
	}
	gpus := placement.FindGPUs()
	if err := resolveNprocWord(&cfg, opts.nprocWord, gpus, runtime.NumCPU()); err != nil { // nproc.go
		return err
	}
	if err := validateLaunchFlags(&cfg, cfg.JobFlagsGiven); err != nil {
		return err
	}
	cfg.Program, cfg.Args = fs.Arg(0), fs.Args()[1:]
	if err := launcher.CheckProgram(cfg.Program); err != nil {
		if pe := (*pyinterp.Error)(nil); errors.As(err, &pe) { // no interpreter for a .py script
			return &usageError{msg: strings.TrimSuffix(err.Error(), "\n"+pe.Hint), hint: pe.Hint}
		}
		return &usageError{msg: err.Error(), hint: "Put the program after `--`: a path (./train), a command on PATH, or a .py script."}
	}
	step, err := placeLaunch(&cfg, pod, opts.verbose)
	if err != nil {
		return err
	}

	if err := checkLaunchBackend(&cfg, gpus, step); err != nil {
		return err
	}
	if err := setUpPreflight(&cfg, opts.preflight, step != nil); err != nil { // preflight.go
		return err
	}

	setUpLaunchOutput(&cfg, opts)

	sigs, dropped := notifyLaunchSignals(handle)
	defer signal.Stop(sigs)
	defer signal.Stop(dropped)
	// From here on, every wait (Slurm's token exchange, the coordinator,
	// the other nodes, ...) ends at the first SIGINT or SIGTERM, and its
	// message names the wait; the loop that runs the workers gets the
	// signals after it on cfg.Signals (internal/launcher/signals).
	var stopSignals context.CancelFunc
	ctx, cfg.Signals, stopSignals = signals.StopOnSignal(ctx, sigs)
	defer stopSignals()

	if self, err := os.Executable(); err == nil {
		cfg.ReaperCommand = []string{self, "launch", reaperArg}
	}
	return signals.StopCause(ctx, step.Run(ctx, cfg, slurm.LocalEnv(os.Getenv, cfg.Logger), launcher.Run))
}

// placeLaunch applies what Slurm's variables, else the pod's, say about
// the job's nodes and this node's place in it; step is nil outside Slurm.
func placeLaunch(cfg *launcher.Config, pod *kubernetes.Pod, verbose bool) (*slurm.Step, error) {
	step, err := slurm.FromEnv(os.Getenv) // inside `srun`: the step's nodes, rank, coordinator
	if err != nil {
		return nil, &usageError{msg: err.Error(), hint: "Run gotrain launch under srun, or set GOTRAIN_SLURM=off to ignore Slurm's variables."}
	}
	step.Apply(cfg, cfg.JobFlagsGiven)
	if step == nil { // Slurm's variables win over a pod's
		if err := applyPod(pod, cfg, cfg.JobFlagsGiven, verbose, os.Stderr); err != nil { // kubernetes.go
			return nil, err
		}
	}
	return step, nil
}

// checkLaunchBackend picks the backend, warns when NCCL is missing for
// it, and checks --ranks-per-gpu and what joining the coordinator needs.
func checkLaunchBackend(cfg *launcher.Config, gpus placement.GPUs, step *slurm.Step) error {
	if err := chooseBackend(cfg, cfg.JobFlagsGiven, gpus, func(w string) { fmt.Fprintln(os.Stderr, w) }); err != nil { // gpus.go
		return err
	}
	if cfg.Backend == "nccl" {
		if _, err := nccl.Load(); err != nil {
			// PyTorch programs bring their own NCCL; Go workers need this one.
			fmt.Fprintf(os.Stderr, "gotrain: warning: --backend nccl, but NCCL cannot be loaded here (%v): Go workers (package worker) will fail to make a communicator; PyTorch programs use their own\n", err)
		}
	}
	if err := checkRanksPerGPU(cfg, cfg.JobFlagsGiven["ranks-per-gpu"]); err != nil { // ranksgpu.go
		return err
	}
	if step == nil && cfg.Coordinator != "" { // under Slurm, munge brings both
		if err := checkJoin(cfg.JobToken, cfg.Trust); err != nil { // validate.go
			return err
		}
	}
	return nil
}

// setUpLaunchOutput sets the agent's stdin, logger and the workers'
// environment (with torchrun's defaults), and prints torchrun's banner
// for a Python program.
func setUpLaunchOutput(cfg *launcher.Config, opts launchOpts) {
	level := slog.LevelWarn
	if opts.verbose || opts.logFormat == logJSON {
		// A log collector wants the records (a timed restart's among them)
		// without --verbose's logfmt.
		level = slog.LevelInfo
	}
	cfg.Stdin = os.Stdin // one rank alone reads it (torchrun's behaviour)
	logDefault := logPeople
	if opts.verbose {
		logDefault = logLogfmt
	}
	cfg.Logger = newLogger(os.Stderr, opts.logFormat, logDefault, level).With("host", hostnameOr("?"))
	cfg.Env = os.Environ()
	torchEnv, warning := jobenv.TorchrunDefaults(os.Getenv, cfg.NprocPerNode, cfg.MaxRestarts) // what torchrun sets too
	// torchrun's banner, when gotrain set the variable, is for Python programs only.
	if warning != "" && pystandby.IsPython(cfg.Program) {
		fmt.Fprintln(os.Stderr, warning)
	}
	cfg.Env = append(cfg.Env, torchEnv...)
}

// notifyLaunchSignals starts catching SIGINT, SIGTERM and the signals to
// handle on sigs, and the ones not passed on (under Slurm) on dropped;
// the caller stops both.
func notifyLaunchSignals(handle []syscall.Signal) (sigs, dropped chan os.Signal) {
	sigs, dropped = make(chan os.Signal, 8), make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	for _, s := range handle {
		signal.Notify(sigs, s)
	}
	if un := slurm.Unforwarded(handle); len(un) > 0 {
		signal.Notify(dropped, un...) // caught, never read: not passed on, and the agent lives
	}
	return sigs, dropped
}

// launchOpts are gotrain launch's flags that are not the agent's Config.
type launchOpts struct {
	verbose   bool
	logFormat string // --log-format; "" follows --verbose (logformat.go)
	nprocWord string // --nproc-per-node auto, gpu or cpu (nproc.go)
	signals   string // --signals-to-handle
	preflight string // --preflight; "": by the job (preflight.go)
}

// launchFlags are gotrain launch's flags: the job-wide ones, which gotrain
// coordinator has too (host.RegisterJobFlags), and the agent's own.
func launchFlags(cfg *launcher.Config, opts *launchOpts) *flag.FlagSet {
	fs := newFlagSet("launch", launchUsage)
	setShortUsage(fs, launchShortUsage, launchShort, launchUsage, launchGroups, launchDetails) // help.go
	host.RegisterJobFlags(fs, &cfg.JobSettings, os.Getenv(jobenv.JobToken))
	registerJobTokenFile(fs) // jobtoken.go
	fs.Var(&nprocFlag{n: &cfg.NprocPerNode, word: &opts.nprocWord}, "nproc-per-node", "`N|auto|gpu|cpu`: the workers on this node: N, auto (one per GPU, or per CPU core without GPUs), gpu (one per GPU: an error without them) or cpu (one per CPU core, on the CPU backend), as torchrun's (default: one per GPU)")
	fs.IntVar(&cfg.NprocPerNode, "gpus", 0, "workers on this node, one per GPU: N GPUs, which the machine must have (an error without them; CPU workers: --nproc-per-node N --backend cpu)")
	fs.IntVar(&cfg.RanksPerGPU, "ranks-per-gpu", 1, "with --backend nccl: how many workers may share one GPU (NCCL 2.30's multi-rank-per-GPU, experimental: workers get NCCL_MULTI_RANK_GPU_ENABLE=1, and NCCL_MAX_CTAS=16/N above 2 unless set); --gpus and --nproc-per-node may then be up to GPUs × N, and default to it")
	fs.StringVar(&cfg.Backend, "backend", "", "data plane: nccl or cpu (default: nccl when the node has GPUs; without GPUs --nproc-per-node N runs on cpu with a warning)")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "also write each rank's output to DIR/RUN_ID/attempt-N/rankN.log: a directory of its own per run (named on stderr), never through a symbolic link; a log dir lost or full mid-job is warned about once and never fails the job")
	fs.IntVar(&cfg.MasterPort, "store-port", 0, "where rank 0's TCPStore listens when this node has rank 0: the MASTER_PORT workers get (gotrain torchrun gives it for --master-port on one node; default: a free port)")
	fs.StringVar(&cfg.Role, "role", "", "the workers' ROLE_NAME, as torchrun's --role (default: default)")
	fs.Func("output", "`MODE` of the workers' console output: prefixed (each line under [rank N], the default) or raw (the bytes as the program wrote them, torchrun's way: gotrain torchrun's default with one rank)", func(s string) error {
		m, err := output.ParseMode(s)
		cfg.Output.Mode = m
		return err
	})
	fs.Func("redirects", "`STREAMS` of the workers kept off the console, into their log files only (needs --log-dir), as torchrun's --redirects: 1 stdout, 2 stderr, 3 both, for every local rank or as LOCAL_RANK:N,... (0:3,1:2)", func(s string) error {
		r, err := output.ParsePerRankStreams("redirects", s)
		cfg.Output.Redirects = r
		return err
	})
	fs.Func("console-ranks", "only these local `ranks` (comma-separated) print on the console; the others' output goes to their log files only (needs --log-dir), as torchrun's --local-ranks-filter", func(s string) error {
		ranks, err := parseLocalRanks(s)
		cfg.Output.ConsoleRanks = ranks
		return err
	})
	fs.StringVar(&cfg.Coordinator, "coordinator", "", "join the coordinator at HOST:PORT (HOST alone: port 29400) instead of starting one here; a replicated coordinator: its replicas, comma-separated (any one is enough, the rest are learnt)")
	fs.StringVar(&cfg.CoordinatorListen, "coordinator-listen", "", "where the embedded coordinator listens (default 127.0.0.1:0 on one node, 0.0.0.0:29400 with --nnodes > 1)")
	fs.StringVar(&cfg.NodeAddress, "node-addr", "", "address other nodes reach this node at (default 127.0.0.1 on one node, else the first non-loopback IPv4)")
	fs.Func("node-rank", "this node's `rank` (0 or more) in the job's node order, as torchrun's --node-rank: nodes with one go by it, after the node that runs the coordinator (always first: group rank 0, MASTER_ADDR); under Slurm, SLURM_NODEID; default: the order the nodes join in", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("give 0 or more, not %q", s)
		}
		cfg.NodeRank = &n
		return nil
	})
	fs.DurationVar(&cfg.GracePeriod, "grace-period", 10*time.Second, "time workers get between SIGTERM and SIGKILL")
	fs.DurationVar(&cfg.JoinTimeout, "join-timeout", 10*time.Minute, "how long to keep trying to reach the coordinator (long enough for a cluster to come up; a line every 10 s says it still waits)")
	cfg.Standby = launcher.StandbyAuto
	fs.Var((*standbyFlag)(&cfg.Standby), "standby", "keep a warmed-up spare worker process per GPU (or CPU rank) that a restarted rank takes over: on, off, or auto (Python programs: with the ranks, on any backend; Go programs: with --backend nccl, once every worker attached with the worker library). A Python standby holds its GPU's CUDA context, "+pyStandbyGPUMemory+" of GPU memory. Each standby holds about one rank's host memory (RSS): auto keeps none when MemAvailable is short of that (Python's are measured 2 s in and dropped then), on starts them anyway")
	fs.Func("standby-preload", "with a Python program: `modules` (comma-separated, e.g. lightning) its standbys import besides torch and torch.distributed", func(s string) error {
		for _, m := range strings.Split(s, ",") {
			if m = strings.TrimSpace(m); m != "" {
				cfg.StandbyPreload = append(cfg.StandbyPreload, m)
			}
		}
		return nil
	})
	fs.DurationVar(&cfg.StandbyTimeout, "standby-timeout", 30*time.Second, "with --standby: a standby of a Go program that has not attached (worker.Init) by then means the program does not support standbys (Python standbys have no timeout: one is used once it is ready)")
	fs.Var(bytesFlag{&cfg.SnapshotMemory}, "snapshot-memory", "the most `bytes` (e.g. 64GiB) of training-state snapshots this agent keeps in memory, its workers' and the replicas its ring neighbour node sends (worker.Snapshots, the gotrain_snapshot Python module); a snapshot or replica that does not fit is refused with an error naming the rank; 0: a quarter of the node's memory")
	fs.IntVar(&cfg.GossipPort, "gossip-port", 0, "with --nnodes > 1: this agent's gossip (memberlist, UDP+TCP) port; 0: any free port. The node that starts the coordinator also gossips at the coordinator's port + 1")
	fs.BoolVar(&cfg.RetryPermanent, "retry-permanent", false, "restart after a failure that can only repeat too: the program cannot be executed (not found, exec format error, permission denied), or a Python ImportError, ModuleNotFoundError or SyntaxError before any progress, or a CUDA out-of-memory at the same step (else the same place) as an earlier attempt's; without it such a failure ends the job at once, and says so")
	fs.StringVar(&opts.preflight, "preflight", "", "`LEVEL` of the checks this node passes before it joins the job (and before it replaces a lost node): quick, full or off. GPU jobs: doctor's driver, ECC/XID, throttling and PCIe link checks and, for Python programs, torch against the driver and GPUs (full adds doctor's smoke test and an NCCL all-reduce judged against the topology); CPU jobs (--backend cpu): the CPU backend's all-reduce between two local ranks, judged against a bandwidth and latency gate. A node that fails is named with the check, measured against expected and the fix; under --nnodes MIN:MAX the job starts without it, otherwise every node exits 4 before any step. Default: quick for multi-node GPU jobs, off otherwise")
	fs.BoolVar(&opts.verbose, "verbose", false, "log the agent's own steps to stderr")
	fs.Var(logFormatFlag{&opts.logFormat}, "log-format", "how the log lines look: people (one \"gotrain: …\" line each; the default), logfmt (time=… level=… msg=… key=value; the default with --verbose, for tools), json (every line on stdout and stderr one object, for log collectors: --verbose's records, each restart's phases among them, gotrain's messages, the workers' lines with their rank, the failure with its exit_code)")
	fs.StringVar(&opts.signals, "signals-to-handle", slurm.DefaultSignals, "signals the agent passes on to every worker, of SIGUSR1,SIGUSR2,SIGHUP,SIGQUIT (\"none\": none; the others are dropped). SIGINT and SIGTERM always stop the workers. Under Slurm, Slurm itself delivers these signals to every worker")
	trustFlags(fs, &cfg.Trust) // tlsflags.go
	serverTLSFlags(fs, &cfg.TLSCert, &cfg.TLSKey)
	return fs
}

// validateLaunchFlags checks launch's own numeric flags and addresses (the
// job-wide ones are host.JobSettings.Validate's); given names the flags on
// the command line.
func validateLaunchFlags(cfg *launcher.Config, given map[string]bool) error {
	nproc := "--nproc-per-node"
	if given["gpus"] {
		nproc = "--gpus"
	}
	switch {
	case cfg.NprocPerNode < 0 || cfg.NprocPerNode == 0 && (given["nproc-per-node"] || given["gpus"]):
		return &usageError{msg: fmt.Sprintf("%s %d", nproc, cfg.NprocPerNode), hint: fmt.Sprintf("Give 1 or more workers (leave %s out for one per GPU).", nproc)}
	case cfg.Backend != "" && cfg.Backend != "cpu" && cfg.Backend != "nccl":
		return &usageError{msg: fmt.Sprintf("--backend %q", cfg.Backend), hint: "Use --backend cpu or --backend nccl."}
	case cfg.GracePeriod < 0:
		return &usageError{msg: fmt.Sprintf("--grace-period %s", cfg.GracePeriod), hint: "Give a duration of 0 or more (0: SIGKILL at once), e.g. --grace-period 10s."}
	case cfg.JoinTimeout <= 0:
		return &usageError{msg: fmt.Sprintf("--join-timeout %s", cfg.JoinTimeout), hint: "Give a positive duration, e.g. --join-timeout 60s."}
	case cfg.StandbyTimeout <= 0:
		return &usageError{msg: fmt.Sprintf("--standby-timeout %s", cfg.StandbyTimeout), hint: "Give a positive duration, e.g. --standby-timeout 30s."}
	}
	if err := checkPort("--gossip-port", cfg.GossipPort); err != nil {
		return err
	}
	cfg.Coordinator = withDefaultPort(cfg.Coordinator)
	if err := checkCoordinatorAddrs(cfg.Coordinator); err != nil { // validate.go
		return err
	}
	if err := checkHostPort("--coordinator-listen", cfg.CoordinatorListen, false); err != nil {
		return err
	}
	if err := checkHostPort("--metrics-addr", cfg.MetricsAddr, false); err != nil {
		return err
	}
	if err := checkNodeAddr(cfg.NodeAddress); err != nil {
		return err
	}
	if err := checkTrust(cfg.Trust); err != nil {
		return err
	}
	return checkServerTLS(cfg.TLSCert, cfg.TLSKey)
}

func hostnameOr(def string) string {
	h, err := os.Hostname()
	if err != nil {
		return def
	}
	return h
}

// standbyFlag is --standby: a bare --standby means on, and --standby=MODE
// or --standby MODE (on, off, auto: joinFlagWords) picks the mode.
type standbyFlag launcher.StandbyMode

var _ wordFlag = (*standbyFlag)(nil)

func (f *standbyFlag) String() string   { return string(*f) }
func (f *standbyFlag) IsBoolFlag() bool { return true }
func (f *standbyFlag) Words() []string {
	return []string{string(launcher.StandbyOn), string(launcher.StandbyOff), string(launcher.StandbyAuto)}
}
func (f *standbyFlag) Set(s string) error {
	m, err := launcher.ParseStandbyMode(s) // a bare --standby sets "true": on
	if err != nil {
		return errors.New("--standby takes on, off or auto: write e.g. --standby=off")
	}
	*f = standbyFlag(m)
	return nil
}

// parseLocalRanks reads a comma-separated list of local ranks (0 or more).
func parseLocalRanks(s string) ([]int, error) {
	ranks := []int{}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("give local ranks (0 or more) separated by commas, e.g. 0,1, not %q", s)
		}
		ranks = append(ranks, n)
	}
	return ranks, nil
}
