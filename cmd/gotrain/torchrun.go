package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/slurm"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/pyinterp"
	"github.com/gotrain/gotrain/internal/runfile"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/torchrun"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/placement"
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

Multi-node lines work as torchrun's, the same line on every node: with
--rdzv-backend c10d the node the --rdzv-endpoint host names (its port free
here) starts the coordinator there and the others join it; with the static
backend (--master-addr lines) node rank 0 does. Every node proves the job
token over TLS: set GOTRAIN_JOB_TOKEN (or GOTRAIN_JOB_TOKEN_FILE) to the
same value on every node; nothing else is copied. A line across machines
without one is refused at once; nodes of one machine on a loopback endpoint
need none (they share their user's run file). gotrain launch's settings
come from GOTRAIN_NAME variables (GOTRAIN_CA_HASH, GOTRAIN_HANG_TIMEOUT,
GOTRAIN_VERBOSE=1, ...), as PET_NAME gives torchrun's.

Scripts run with $PYTHON_EXEC, else the venv of a torchrun symlink, else
the interpreter of PyTorch's torchrun on PATH, else PATH's python3 (which
must find torch); the choice is printed once.

Output is torchrun's: one rank's is its bytes as written (gotrain
torchrun --nproc_per_node=1 eval.py > out.json is the program's JSON), and
one rank reads gotrain's stdin (breakpoint() works); with several ranks
each line is prefixed [rank N]. --tee (-t), --redirects (-r) and --local-ranks-filter
send output to DIR/RUN_ID/attempt-N/rankN.log under --log-dir (a temporary
directory, named on stderr, when none is given), --redirects and
--local-ranks-filter keep it off the console. --role sets ROLE_NAME;
--master_port on one node is rank 0's TCPStore port; ${local_rank} in the
script's arguments becomes each worker's local rank. --standalone with
--nnodes 1:N runs this node alone (no node can join a standalone line).

Accepted without effect, with a note each: --rdzv-backend on one node,
--rdzv-conf, --monitor-interval, --start-method, --local-addr, --run-path,
--logs-specs. Unambiguous abbreviations work as in torchrun (--nproc=2).
torchrun 2.x's --virtual-local-rank, --numa-binding, --event-log-handler,
--log-line-prefix-template and --enable-nvtx are refused with the reason.
Any other flag is an error.

Examples:
  gotrain torchrun --nproc_per_node=2 --standalone train.py --epochs 3
  gotrain torchrun --nproc_per_node=gpu -m mypkg.train --lr 0.1
  gotrain torchrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 train.py
  GOTRAIN_JOB_TOKEN=… gotrain torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint node0:29400 train.py
`

func (c *torchrunCmd) run(ctx context.Context, args []string) (retErr error) {
	if os.Getenv(torchrun.SettingEnv("log-format")) == logJSON { // its own lines too, before launch's (logjson.go)
		end, err := jsonConsole(hostnameOr("?"))
		if err != nil {
			return err
		}
		defer func() { retErr = end(retErr) }()
	}
	return runTorchrun(ctx, args, os.Stdout, os.Stderr)
}

func runTorchrun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := keepMemoryPrivate(); err != nil { // nodump.go: before the token and keys are read
		return err
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fs := torchrunFlags()
		fs.SetOutput(stdout)
		fs.Usage()
		return flag.ErrHelp
	}
	gpus := placement.FindGPUs()
	m := torchrun.Machine{GPUs: gpus.N, GPUsHow: gpus.How, CPUs: runtime.NumCPU(), Getenv: os.Getenv,
		IsLocal: hostIsLocal, CanListen: canListen, HasSecret: hasJobSecret(), LaunchFlags: launchFlagKinds()}
	r, err := torchrun.Map(args, m)
	if err == nil && r.Python {
		// Map again with the interpreter torchrun would run.
		// The rule is launch's too (internal/pyinterp): torchrun's script needs torch.
		py, perr := pyinterp.Choose(pyinterp.System("gotrain torchrun --no-python python3 …"), true)
		if pe := (*pyinterp.Error)(nil); errors.As(perr, &pe) {
			return &usageError{msg: pe.Msg, hint: pe.Hint}
		} else if perr != nil {
			return perr
		}
		fmt.Fprintf(stderr, "gotrain torchrun: running Python %s (%s)\n", py.Path, py.Why)
		m.Python = py.Path
		r, err = torchrun.Map(args, m)
	}
	if errors.Is(err, torchrun.ErrNoSecret) {
		return &usageError{msg: strings.TrimPrefix(err.Error(), torchrun.ErrNoSecret.Error()+": "), hint: torchrun.SecretHelp}
	}
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
	if r.LocalToken != "" {
		// A loopback endpoint and no secret given: the coordinator is this
		// user's launcher on this machine, whose run file holds the token.
		j, err := waitLocalJob(ctx, r.LocalToken, stderr)
		if err != nil {
			return err
		}
		os.Setenv(jobenv.JobToken, j.Token) // launch's --job-token default; never in argv
		fmt.Fprintf(stderr, "gotrain torchrun: joining the coordinator at port %s that your gotrain (pid %d, run %s) started on this machine, with its job token (from its run file, readable by you alone)\n", r.LocalToken, j.Pid, j.RunID)
		if j.Trust.CAHash != "" {
			r.LaunchArgs = append([]string{"--ca-hash", j.Trust.CAHash}, r.LaunchArgs...)
		}
	}
	if r.TempLogDir {
		// torchrun makes a temporary log dir when the line writes logs
		// and names none; so does gotrain (the launcher says where).
		dir, err := os.MkdirTemp("", "gotrain-torchrun-logs-")
		if err != nil {
			return fmt.Errorf("a log dir for --tee/--redirects/--local-ranks-filter: %w (give --log-dir DIR)", err)
		}
		r.LaunchArgs = append([]string{"--log-dir", dir}, r.LaunchArgs...)
		defer os.Remove(dir) // only when empty: the job never started
	}
	return (&launchCmd{}).run(ctx, r.LaunchArgs)
}

// hasJobSecret says whether every node gets the job's secret without
// copying anything: a token in the environment or a token file, or a
// Slurm step, whose munge brings it.
func hasJobSecret() bool {
	if os.Getenv(jobenv.JobToken) != "" || os.Getenv(torchrun.SettingEnv(FlagJobTokenFile)) != "" {
		return true
	}
	step, err := slurm.FromEnv(os.Getenv)
	return err == nil && step != nil
}

// launchFlagKinds are gotrain launch's flags, each with whether it is a
// boolean, for GOTRAIN_NAME settings (torchrun.Machine.LaunchFlags).
func launchFlagKinds() map[string]bool {
	var cfg launcher.Config
	var opts launchOpts
	kinds := map[string]bool{}
	launchFlags(&cfg, &opts).VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		kinds[f.Name] = ok && b.IsBoolFlag()
	})
	return kinds
}

// hostIsLocal says whether host names this machine, as torchrun decides
// which node hosts its c10d store: a loopback address, this machine's
// hostname, or a name or address that resolves to one of its interfaces'
// addresses.
func hostIsLocal(host string) bool {
	if h, err := os.Hostname(); err == nil && strings.EqualFold(h, host) {
		return true
	}
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var err error
		if ips, err = net.DefaultResolver.LookupHost(ctx, host); err != nil {
			return false
		}
	}
	for _, s := range ips {
		if ip := net.ParseIP(s); ip != nil && (ip.IsLoopback() || local[ip.String()]) {
			return true
		}
	}
	return false
}

// canListen says whether this process can listen at addr now. For a
// loopback address it also takes a lock that this process holds until it
// exits (runfile.Dir()/torchrun-PORT.lock, close-on-exec, so no worker
// holds it): two nodes of one machine started at the same moment both
// find the port free, and only the lock's holder starts the coordinator.
func canListen(addr string) bool {
	if v, ok := listenChecked[addr]; ok { // torchrun.Map runs twice
		return v
	}
	v := tryListen(addr)
	listenChecked[addr] = v
	return v
}

// listenChecked memoizes canListen: the lock it took is this process's.
var listenChecked = map[string]bool{}

func tryListen(addr string) bool {
	if host, port, err := net.SplitHostPort(addr); err == nil && net.ParseIP(host).IsLoopback() {
		dir, err := runfile.MakeDir()
		if err != nil {
			return false
		}
		f, err := os.OpenFile(filepath.Join(dir, "torchrun-"+port+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return false
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			return false
		}
		heldLocks = append(heldLocks, f) // held until gotrain exits
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// heldLocks are the coordinator locks canListen took.
var heldLocks []*os.File

// waitLocalJob waits for the run file of this user's launcher on this
// machine whose coordinator listens at port: the node that started first
// runs the coordinator, the others wait for it as they would for its port.
func waitLocalJob(ctx context.Context, port string, stderr io.Writer) (runfile.Job, error) {
	const timeout = 10 * time.Minute
	deadline, said := time.Now().Add(timeout), time.Now()
	for {
		jobs, _ := runfile.Live()
		for _, j := range jobs {
			for _, a := range strings.Split(j.Coordinator, ",") {
				if _, p, err := net.SplitHostPort(strings.TrimSpace(a)); err == nil && p == port && j.Token != "" {
					return j, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return runfile.Job{}, fmt.Errorf("no gotrain coordinator of yours started on this machine at port %s within %s: start the node that runs it (its port is taken by another program?), or set %s on every node", port, timeout, jobenv.JobToken)
		}
		if time.Since(said) >= 10*time.Second {
			said = time.Now()
			fmt.Fprintf(stderr, "gotrain torchrun: waiting for the coordinator at port %s on this machine (another node of this job starts it)\n", port)
		}
		select {
		case <-ctx.Done():
			return runfile.Job{}, fmt.Errorf("waiting for the coordinator at port %s on this machine: %w", port, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// torchrunFlags documents the flags for --help; torchrun.Map parses them
// (both spellings, PET_* defaults), not this FlagSet.
func torchrunFlags() *flag.FlagSet {
	fs := newFlagSet("torchrun", torchrunUsage)
	setGroupedUsage(fs, torchrunUsage, torchrunGroups, "") // help.go
	fs.String("nproc-per-node", "1", "`N|auto|gpu|cpu`: the workers on this node: N, auto (the GPUs, else the CPUs), gpu (the GPUs: an error without them) or cpu; without enough GPUs, gotrain's CPU backend, with a warning")
	fs.Bool("standalone", false, "one node with its own coordinator (rendezvous flags have no effect)")
	fs.String("nnodes", "1", "`N|MIN:MAX`: nodes: N, or MIN:MAX (elastic)")
	fs.String("rdzv-endpoint", "", "HOST:PORT of gotrain's coordinator: the node HOST names starts it at PORT (c10d), the others join it")
	fs.String("rdzv-backend", "", "c10d: the endpoint's host runs the coordinator; static (torchrun's default): node rank 0 does; etcd: refused")
	fs.String("master-addr", "", "with --master-port and no --rdzv-endpoint: the coordinator's host")
	fs.String("master-port", "", "with --master-addr: the coordinator's port")
	fs.String("node-rank", "", "static backend: 0 starts the coordinator (group rank 0); others: the node's place after it (gotrain launch --node-rank)")
	fs.String("rdzv-id", "", "the run id (TORCHELASTIC_RUN_ID)")
	fs.Int("max-restarts", 0, "restarts after a worker fails")
	fs.String("log-dir", "", "each rank's log in DIR/RUN_ID/attempt-N")
	fs.String("signals-to-handle", "", "SIGTERM and SIGINT always stop the workers; SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 are passed on")
	fs.Bool("module", false, "run a module: python3 -u -m MODULE (also -m)")
	fs.Bool("no-python", false, "run the program itself, not through python3")
	return fs
}
