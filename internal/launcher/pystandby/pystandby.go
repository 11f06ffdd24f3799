package pystandby

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/workerenv"
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

// Program is a Python program as its command line says.
type Program struct {
	options []string // the interpreter's options, before the script or -m
	path    string   // the script, or
	module  string   // the module (-m)
	args    []string // the program's arguments
}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// Parse reads program and args as a Python interpreter would. It
// returns nil and "" when program is no Python interpreter, nil and why
// when it is one but the program cannot be pre-warmed.
func Parse(program string, args []string) (*Program, string) {
	if !pythonName.MatchString(filepath.Base(program)) {
		return nil, ""
	}
	py := &Program{}
	cold := func(why string) (*Program, string) {
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

// Link is the agent's end of a Python standby's socket pair. The loop
// writes the assignment on it and closes it; a goroutine reads what the
// standby says.
type Link struct {
	conn *net.UnixConn
	// OnPreloaded, when set before Read starts, is called (from Read's
	// goroutine) with what the standby imported of a Preload list, and
	// how many names the list had.
	OnPreloaded func(modules []string, tried int)
}

// SocketPair makes a standby's socket pair: the agent's end, and the
// standby's, which it inherits as fd 3 (the caller closes its copy once the
// standby started).
func SocketPair() (*Link, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "pystandby-agent"), os.NewFile(uintptr(fds[1]), "pystandby")
	c, err := net.FileConn(ours)
	_ = ours.Close()
	if err != nil {
		_ = theirs.Close()
		return nil, nil, err
	}
	return &Link{conn: c.(*net.UnixConn)}, theirs, nil
}

// Close closes the agent's end: the bootstrap exits at EOF, and Read ends.
func (l *Link) Close() error { return l.conn.Close() }

// command is the standby's argv after the interpreter: the program's
// options, the bootstrap, and its arguments (the socket's fd, the CUDA
// device index, the preload list).
func (p *Program) command(device int, preload []string) []string {
	args := slices.Clone(p.options)
	return append(args, "-c", pyBootstrap, "3", strconv.Itoa(device), strings.Join(preload, ","))
}

// Command is the argv after the interpreter of the standby of slot on CUDA
// device (an index into its CUDA_VISIBLE_DEVICES, -1: none), preloading
// preload (--standby-preload). The interpreter's options are given before
// the rank is known: the slot is the local rank it will run, so torchrun's
// ${local_rank} in them becomes the slot. The bootstrap after them is no
// argument of the program's.
func (p *Program) Command(device int, preload []string, slot int) []string {
	args := p.command(device, preload)
	n := len(p.options)
	return append(workerenv.SubstituteLocalRank(args[:n:n], slot), args[n:]...)
}

// pyMessage is what a Python standby says.
type pyMessage struct {
	Ready bool    `json:"ready"`
	Error string  `json:"error"`
	Torch string  `json:"torch"`
	WarmS float64 `json:"warm_s"`
	// Preloaded answers Preload: the modules it imported, of Tried.
	Preloaded *[]string `json:"preloaded"`
	Tried     int       `json:"tried"`
}

// Read turns what the standby of slot (process pid, numbered stream) says
// into the machine's events, handed to post, until the socket ends (the
// process exited, or the agent closed its end).
func (l *Link) Read(log *slog.Logger, post func(agentcore.Event), slot, pid int, stream uint64) {
	sc := bufio.NewScanner(l.conn)
	ready := false
	for sc.Scan() {
		var m pyMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			post(agentcore.StandbyUnfit{Slot: slot, Pid: pid, Reason: fmt.Sprintf("bad message from the bootstrap: %q", sc.Text())})
			return
		}
		switch {
		case m.Preloaded != nil:
			log.Info("python standby preloaded", "slot", slot, "pid", pid, "modules", len(*m.Preloaded), "of", m.Tried)
			if l.OnPreloaded != nil {
				l.OnPreloaded(*m.Preloaded, m.Tried)
			}
		case m.Error != "":
			post(agentcore.StandbyUnfit{Slot: slot, Pid: pid, Reason: m.Error})
			return
		case m.Ready && !ready:
			ready = true
			log.Info("python standby warm", "slot", slot, "pid", pid, "torch", m.Torch, "seconds", m.WarmS)
			post(agentcore.StandbyHello{Slot: slot, Pid: pid, Stream: stream})
		}
	}
	if ready {
		post(agentcore.StandbyDetached{Slot: slot, Pid: pid, Stream: stream})
	}
}

// Bounds on what a standby preloads: how long it may import, and how
// much its RSS may grow (a standby holds memory a rank may need).
const (
	PreloadSeconds = 60.0
	PreloadGrowth  = 2 << 30
)

// Preload tells the standby to import modules (the installed packages the
// job's first attempt imported) while it waits, within seconds and growth
// bytes of RSS (PreloadSeconds, PreloadGrowth); it answers with what it
// did import, which Read logs.
func (l *Link) Preload(modules []string, seconds float64, growth int64) error {
	b, err := json.Marshal(struct {
		Preload []string `json:"preload"`
		Seconds float64  `json:"seconds"`
		Growth  int64    `json:"growth"`
	}{modules, seconds, growth})
	if err != nil {
		return err
	}
	_ = l.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := l.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("tell the Python standby what to preload: %w", err)
	}
	return nil
}

// PreloadLine is the line the agent prints when its first standby
// imported what the job's first attempt did (tried names, of which
// modules were not imported with torch already): "gotrain: Python
// standbys preload transformers, datasets (+12 more) from the job's first
// attempt".
func PreloadLine(modules []string, tried int) string {
	if len(modules) == 0 {
		return fmt.Sprintf("gotrain: Python standbys preload nothing more: the %d installed packages the job's first attempt imported come with torch", tried)
	}
	const shown = 4
	s := strings.Join(modules[:min(len(modules), shown)], ", ")
	if n := len(modules) - shown; n > 0 {
		s += fmt.Sprintf(" (+%d more)", n)
	}
	return "gotrain: Python standbys preload " + s + " from the job's first attempt"
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

// Hand writes the rank's assignment to its standby, which runs py, and
// closes the agent's end. env is exactly a spawned worker's environment;
// torchrun's ${local_rank} in the script, module and arguments becomes
// localRank.
func (l *Link) Hand(py *Program, env []string, localRank int) error {
	cwd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	msg := pyAssignment{Env: env, Cwd: cwd, Args: workerenv.SubstituteLocalRank(py.args, localRank)}
	if py.path != "" {
		msg.Path = workerenv.SubstituteLocalRank([]string{py.path}, localRank)[0]
	}
	if py.module != "" {
		msg.Module = workerenv.SubstituteLocalRank([]string{py.module}, localRank)[0]
	}
	if msg.Args == nil {
		msg.Args = []string{}
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	conn := l.conn
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
