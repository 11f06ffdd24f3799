package launcher

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/launcher/agentcore"
	"github.com/gotrain/gotrain/launcher/observe"
	"github.com/gotrain/gotrain/launcher/relay"
	"github.com/gotrain/gotrain/launcher/workerenv"
)

// Python hot standbys, the shell's half (the machine decides: agentcore,
// Config.Python). For a program run by a Python interpreter (`python3
// [options] SCRIPT ARGS`, `python3 [options] -m MODULE ARGS`, a SCRIPT.py
// that resolveProgram gave to python3), a standby is the same interpreter
// with the same options running pystandby.py: it imports torch,
// torch.distributed and --standby-preload, initialises CUDA on the slot's
// GPU, says it is ready and waits. Agent and standby talk JSON lines over a
// socket pair the standby inherits as fd 3 (no Python package beyond the
// standard library, no proto): {"ready"} or {"error"} from it, one
// assignment to it (the rank's whole environment as a spawned worker gets
// it, the working directory, the script or module and its arguments).
// Then it runs the program in its own __main__ as `python SCRIPT` or
// `python -m MODULE` would. It is supervised as any worker (own process
// group, PDEATHSIG, reaped, reaper); the agent closes its end once the
// assignment is written.

//go:embed pystandby.py
var pyBootstrap string

// pythonProgram is a Python program as its command line says.
type pythonProgram struct {
	options []string // the interpreter's options, before the script or -m
	path    string   // the script, or
	module  string   // the module (-m)
	args    []string // the program's arguments
}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// parsePython reads program and args as a Python interpreter would. It
// returns nil and "" when program is no Python interpreter, nil and why
// when it is one but the program cannot be pre-warmed.
func parsePython(program string, args []string) (*pythonProgram, string) {
	if !pythonName.MatchString(filepath.Base(program)) {
		return nil, ""
	}
	py := &pythonProgram{}
	cold := func(why string) (*pythonProgram, string) {
		return nil, fmt.Sprintf("%s %s: %s", filepath.Base(program), strings.Join(args, " "), why)
	}
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if a == "-" {
			return cold("the program comes from stdin")
		}
		if !strings.HasPrefix(a, "-") {
			break
		}
		if strings.HasPrefix(a, "--") {
			if a == "--check-hash-based-pycs" && i+1 < len(args) {
				py.options = append(py.options, a, args[i+1])
				i++
				continue
			}
			return cold(fmt.Sprintf("interpreter option %s cannot be pre-warmed", a))
		}
	chars:
		for j := 1; j < len(a); j++ {
			switch c := a[j]; c {
			case 'b', 'B', 'd', 'E', 'I', 'O', 'P', 'q', 'R', 's', 'S', 'u', 'v':
				if j == len(a)-1 {
					py.options = append(py.options, a)
				}
			case 'W', 'X':
				py.options = append(py.options, a)
				if j == len(a)-1 {
					if i+1 >= len(args) {
						return cold(fmt.Sprintf("-%c needs a value", c))
					}
					py.options = append(py.options, args[i+1])
					i++
				}
				break chars
			case 'm':
				if j > 1 {
					py.options = append(py.options, a[:j])
				}
				py.module = a[j+1:]
				if py.module == "" {
					if i+1 >= len(args) {
						return cold("no module after -m")
					}
					i++
					py.module = args[i]
				}
				py.args = args[i+1:]
				return py, ""
			case 'c':
				return cold("-c runs a command string, not a script or module")
			case 'i':
				return cold("-i (interactive after the program) cannot be pre-warmed")
			default:
				return cold(fmt.Sprintf("interpreter option -%c cannot be pre-warmed", c))
			}
		}
	}
	if i >= len(args) {
		return cold("no script or module to run")
	}
	py.path, py.args = args[i], args[i+1:]
	return py, ""
}

// pyLink is the agent's end of a Python standby's socket pair. The loop
// writes the assignment on it and closes it; a goroutine reads what the
// standby says.
type pyLink struct {
	conn *net.UnixConn
}

// pyStandbyCommand is the standby's argv after the interpreter: the
// program's options, the bootstrap, and its arguments (the socket's fd,
// the CUDA device index, the preload list).
func (a *agent) pyStandbyCommand(device int) []string {
	args := slices.Clone(a.py.options)
	return append(args, "-c", pyBootstrap, "3", strconv.Itoa(device), strings.Join(a.cfg.StandbyPreload, ","))
}

// spawnPythonStandby starts a Python standby for act's slot.
func (a *agent) spawnPythonStandby(act agentcore.SpawnStandby) []agentcore.Event {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: fmt.Sprintf("socket pair for a Python standby: %v", err)}}
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "pystandby-agent"), os.NewFile(uintptr(fds[1]), "pystandby")
	c, err := net.FileConn(ours)
	_ = ours.Close()
	if err != nil {
		_ = theirs.Close()
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: fmt.Sprintf("socket pair for a Python standby: %v", err)}}
	}
	conn := c.(*net.UnixConn)
	device := -1
	if act.GPU >= 0 {
		device = slices.Index(act.GPUs, act.GPU)
	}
	// The interpreter's options are given before the rank is known: the
	// slot is the local rank it will run (see spawnStandby). The bootstrap
	// after them is no argument of the program's.
	args := a.pyStandbyCommand(device)
	n := len(a.py.options)
	args = append(workerenv.SubstituteLocalRank(args[:n:n], act.Slot), args[n:]...)
	spec := workerSpec{rank: -1, standby: true, slot: act.Slot, program: a.cfg.Program, args: args,
		env: a.workerEnv(act.Vars.Environ(), act.GPUs), logDir: a.cfg.LogDir, logTrouble: a.logTrouble, extra: []*os.File{theirs},
		output: a.cfg.Output, stdin: a.workerStdin(), argv0: a.argv0}
	p, err := startWorker(a.sup, spec, a.stdout, a.stderr)
	_ = theirs.Close()
	if err != nil {
		_ = conn.Close()
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: err.Error()}}
	}
	p.py = &pyLink{conn: conn}
	a.log.Info("python standby started", "slot", act.Slot, "gpu", act.GPU, "pid", p.pid())
	a.adopt(act.Proc, p, relay.Proc{Standby: true, Slot: act.Slot, Local: act.Slot}, act.GPU, observe.Evidence{})
	stream := a.links.Next()
	a.waits.Add(1)
	go func() {
		defer a.waits.Done()
		a.readPyStandby(conn, act.Slot, p.pid(), stream)
	}()
	return []agentcore.Event{agentcore.Spawned{Proc: act.Proc, Pid: p.pid()}}
}

// pyMessage is what a Python standby says.
type pyMessage struct {
	Ready bool    `json:"ready"`
	Error string  `json:"error"`
	Torch string  `json:"torch"`
	WarmS float64 `json:"warm_s"`
}

// readPyStandby turns what the standby of slot says into the machine's
// events, until the socket ends (the process exited, or the agent closed
// its end).
func (a *agent) readPyStandby(conn *net.UnixConn, slot, pid int, stream uint64) {
	sc := bufio.NewScanner(conn)
	ready := false
	for sc.Scan() {
		var m pyMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			a.post(agentcore.StandbyUnfit{Slot: slot, Pid: pid, Reason: fmt.Sprintf("bad message from the bootstrap: %q", sc.Text())})
			return
		}
		switch {
		case m.Error != "":
			a.post(agentcore.StandbyUnfit{Slot: slot, Pid: pid, Reason: m.Error})
			return
		case m.Ready && !ready:
			ready = true
			a.log.Info("python standby warm", "slot", slot, "pid", pid, "torch", m.Torch, "seconds", m.WarmS)
			a.post(agentcore.StandbyHello{Slot: slot, Pid: pid, Stream: stream})
		}
	}
	if ready {
		a.post(agentcore.StandbyDetached{Slot: slot, Pid: pid, Stream: stream})
	}
}

// pyAssignment is what a Python standby is handed: everything a fresh
// `python SCRIPT ARGS` of the rank would have.
type pyAssignment struct {
	Env    []string `json:"env"`
	Cwd    string   `json:"cwd"`
	Path   string   `json:"path,omitempty"`
	Module string   `json:"module,omitempty"`
	Args   []string `json:"args"`
}

// handToPython writes the rank's assignment to its standby and closes the
// agent's end. env is exactly a spawned worker's environment; torchrun's
// ${local_rank} in the script, module and arguments becomes localRank.
func (a *agent) handToPython(p *workerProc, env []string, localRank int) error {
	cwd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	msg := pyAssignment{Env: env, Cwd: cwd, Args: workerenv.SubstituteLocalRank(a.py.args, localRank)}
	if a.py.path != "" {
		msg.Path = workerenv.SubstituteLocalRank([]string{a.py.path}, localRank)[0]
	}
	if a.py.module != "" {
		msg.Module = workerenv.SubstituteLocalRank([]string{a.py.module}, localRank)[0]
	}
	if msg.Args == nil {
		msg.Args = []string{}
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	conn := p.py.conn
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("hand the rank to the Python standby: %w", err)
	}
	return nil
}

// IsPython says whether program (as given to gotrain launch) runs as a
// Python program: a .py script, or a python interpreter.
func IsPython(program string) bool {
	return strings.HasSuffix(program, ".py") || pythonName.MatchString(filepath.Base(program))
}
