package kubernetes

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container's entrypoint is PID 1 of the pod's PID namespace (or the
// container's), which brings two duties no other process has: orphans are
// re-parented to it and stay zombies until it reaps them, and the kernel
// drops every signal it has no handler for (a SIGTERM from the kubelet
// included). The agent reaps only what it started (package supervise:
// wait4 on its own pids, never wait4(-1)), so as PID 1 gotrain splits in
// two, as tini does: this init, which starts the agent as its only child,
// passes it every signal, reaps every process that ends, and exits with
// the agent's status; and the agent, which runs as anywhere else.

// forwarded are the signals the init passes on to the agent: what a
// kubelet, `kubectl exec kill` or a preStop hook may send.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGCONT}

// InitWanted says whether this process is to be init: it is PID 1 and
// GOTRAIN_KUBERNETES is not off.
func InitWanted(getenv func(string) string) bool {
	if v := getenv(EnvOff); v == "off" || v == "0" || v == "false" {
		return false
	}
	return os.Getpid() == 1
}

// RunInit starts the program at path with argv (argv[0] is the name the
// process sees: gotrain's own executable and os.Args, for the agent) and env as
// the only child of this process, and until it ends passes it the
// forwarded signals and reaps every child that ends (orphans of the job's
// processes included). It returns the status to exit with: the child's
// exit code, or 128+N when signal N ended it. A child that cannot start
// gives a message on stderr and 127.
func RunInit(path string, argv, env []string, stderr io.Writer) int {
	sigs := make(chan os.Signal, 32)
	// Notified before the start: a SIGCHLD of a child that ends at once is
	// not missed, nor a SIGTERM that comes while it starts.
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	defer signal.Stop(sigs)
	child, err := os.StartProcess(path, argv, &os.ProcAttr{Env: env, Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(stderr, "gotrain: as PID 1 (the container's entrypoint): start the agent (%s): %v\n", path, err)
		return 127
	}
	pid := child.Pid
	for {
		// Reap whatever ended, the agent last: after its exit, the kernel
		// kills what is left of the namespace with this process.
		for {
			var ws unix.WaitStatus
			got, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || got <= 0 {
				break
			}
			if got == pid {
				switch {
				case ws.Exited():
					return ws.ExitStatus()
				case ws.Signaled():
					return 128 + int(ws.Signal())
				}
				return 1
			}
		}
		s := <-sigs
		if s == syscall.SIGCHLD {
			continue
		}
		_ = child.Signal(s) // gone already: its SIGCHLD is on the way
	}
}
