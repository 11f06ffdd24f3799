// Package podsim starts a container's command the way a kubelet starts a
// pod's, on a host of a virtual cluster (internal/testing/vcluster), for tests that
// run gotrain "in pods" without a container runtime: the command gets PID,
// mount and UTS namespaces of its own (it is PID 1 of its pod; the pod ends
// with it), the pod's hostname, an /etc/hosts that stands for the cluster
// DNS records of its headless Service, and the pod's volumes (Secrets)
// bind-mounted read-only. The host's network namespace is the pod's
// network: its address is the pod IP.
//
// The file system is otherwise the machine's own, as the "image": a pod's
// command names binaries by their paths here.
//
// # Usage
//
//	p := podsim.Start(host, podsim.Pod{Hostname: "train-0", HostsFile: hosts, Env: env, Argv: argv})
//	pid1, err := podsim.PID1(p, time.Minute) // its host pid, for SIGTERM
package podsim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// Pod is what a container is started with.
type Pod struct {
	// Hostname is the pod's hostname (spec.hostname, or its name).
	Hostname string
	// HostsFile is bind-mounted at /etc/hosts. Rewritten in place (same
	// file, new contents), it changes what every pod resolves, as DNS
	// records change.
	HostsFile string
	// Mounts are bind-mounted read-only, after a tmpfs of the pod's own is
	// mounted at /run (so that /var/run/secrets/… can be made without
	// touching the machine's /run).
	Mounts []Mount
	// Env is added to the test process's environment.
	Env []string
	// Argv is the container's command and arguments.
	Argv []string
}

// Mount is a directory made visible inside the pod.
type Mount struct {
	Source, Target string
}

// script runs inside the pod's namespaces, before the container's command:
// $0 the hosts file, $1 the hostname, $2 the number of mounts, then that
// many source/target pairs, then the command.
const script = `set -e
mount --bind "$0" /etc/hosts
hostname "$1"
n=$2
shift 2
[ "$n" -eq 0 ] || mount -t tmpfs -o mode=0755 pod-run /run
while [ "$n" -gt 0 ]; do
	mkdir -p "$2"
	mount --bind -o ro "$1" "$2"
	shift 2
	n=$((n - 1))
done
exec "$@"`

// Start starts the pod's command on h (see vcluster.Host.StartEnv). unshare
// makes the PID namespace (--kill-child: the pod's processes end with
// unshare) and the mount namespace (private: nothing mounted in it is seen
// outside).
func Start(h *vcluster.Host, p Pod) *vcluster.Proc {
	argv := []string{"unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script,
		p.HostsFile, p.Hostname, strconv.Itoa(len(p.Mounts))}
	for _, m := range p.Mounts {
		argv = append(argv, m.Source, m.Target)
	}
	return h.StartEnv(p.Env, append(argv, p.Argv...)...)
}

// PID1 is the host pid of the pod's PID 1 (unshare's child), waiting up to
// d for it to be forked.
func PID1(p *vcluster.Proc, d time.Duration) (int, error) {
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.Pid(), p.Pid()))
		if err != nil {
			return 0, fmt.Errorf("podsim: the pod's unshare (pid %d): %w", p.Pid(), err)
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			return strconv.Atoi(f[0])
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("podsim: pid %d forked no PID 1 within %s", p.Pid(), d)
		}
	}
}

// Procs are the host pids of the processes on h whose argv[0] is program
// (a pod's workers, say: the agent's argv names program too, later).
func Procs(h *vcluster.Host, program string) []int {
	var out []int
	for _, pid := range h.Pids() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if argv0, _, _ := strings.Cut(string(b), "\x00"); argv0 == program {
			out = append(out, pid)
		}
	}
	return out
}
