package slurm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Forwardable are the signals gotrain launch can pass on to every worker
// (--signals-to-handle, torchrun's flag of that name): SIGUSR1, SIGUSR2,
// SIGHUP, SIGQUIT. SIGINT and SIGTERM always stop the workers.
var Forwardable = []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGQUIT}

// DefaultSignals is --signals-to-handle's default: all of Forwardable.
const DefaultSignals = "SIGUSR1,SIGUSR2,SIGHUP,SIGQUIT"

// ParseSignals reads --signals-to-handle: a comma-separated list of
// Forwardable's names, with or without SIG, any case; "" or "none": none.
func ParseSignals(list string) ([]syscall.Signal, error) {
	var out []syscall.Signal
	if strings.EqualFold(strings.TrimSpace(list), "none") {
		return nil, nil
	}
	for _, f := range strings.Split(list, ",") {
		name := strings.ToUpper(strings.TrimSpace(f))
		if name == "" {
			continue
		}
		if !strings.HasPrefix(name, "SIG") {
			name = "SIG" + name
		}
		sig := unix.SignalNum(name)
		if sig == 0 || !slices.Contains(Forwardable, sig) {
			return nil, fmt.Errorf("--signals-to-handle: %q cannot be forwarded: choose among %s (SIGINT and SIGTERM always stop the workers)", strings.TrimSpace(f), DefaultSignals)
		}
		if !slices.Contains(out, sig) {
			out = append(out, sig)
		}
	}
	return out, nil
}

// Unforwarded are the Forwardable signals not in handle: gotrain launch
// catches them too (their default action would end the agent and leave its
// workers to the reaper) and drops them.
func Unforwarded(handle []syscall.Signal) []os.Signal {
	var out []os.Signal
	for _, s := range Forwardable {
		if !slices.Contains(handle, s) {
			out = append(out, s)
		}
	}
	return out
}

// KillWait is the cluster's KillWait (how long Slurm waits between the
// SIGTERM of scancel or a time limit and its SIGKILL), read from
// slurm.conf ($SLURM_CONF, which slurmd sets for configless clusters too;
// default /etc/slurm/slurm.conf); 0 when it cannot be read, Slurm's
// default (30 s) when the file does not set it.
func KillWait(getenv func(string) string, readFile func(string) ([]byte, error)) time.Duration {
	v, found, ok := confValue(getenv, readFile, "KillWait")
	switch {
	case !ok:
		return 0
	case !found:
		return 30 * time.Second
	}
	var secs int
	if _, err := fmt.Sscan(v, &secs); err != nil || secs < 0 {
		return 0
	}
	return time.Duration(secs) * time.Second
}

// confValue is key's value in slurm.conf: found says the file sets it, ok
// that the file was read.
func confValue(getenv func(string) string, readFile func(string) ([]byte, error), key string) (v string, found, ok bool) {
	conf := getenv("SLURM_CONF")
	if conf == "" {
		conf = "/etc/slurm/slurm.conf"
	}
	b, err := readFile(conf)
	if err != nil {
		return "", false, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		k, v, isKV := strings.Cut(strings.TrimSpace(line), "=")
		if isKV && strings.EqualFold(strings.TrimSpace(k), key) {
			return strings.TrimSpace(v), true, true
		}
	}
	return "", false, true
}

// killWaitMargin is what the agent keeps of KillWait for itself: after its
// workers' grace period it still reports and exits before Slurm's SIGKILL.
const killWaitMargin = 2 * time.Second

// FitGrace returns the grace period (between the workers' SIGTERM and
// SIGKILL) to use in a step whose cluster has killWait (0: unknown): grace
// when it ends killWaitMargin before KillWait, else KillWait less that
// margin (at least 1 s), and a note saying so. Otherwise Slurm's SIGKILL
// would come first: workers lose the end of their grace and the agent
// exits without a word.
func FitGrace(grace, killWait time.Duration) (time.Duration, string) {
	if killWait <= 0 || grace+killWaitMargin <= killWait {
		return grace, ""
	}
	fit := max(killWait-killWaitMargin, time.Second)
	if fit >= grace {
		return grace, ""
	}
	return fit, fmt.Sprintf("--grace-period %s does not fit in the cluster's KillWait (%s, slurm.conf): using %s, so that workers get their whole grace and gotrain exits before Slurm's SIGKILL; ask for a larger KillWait to give workers longer", grace, killWait, fit)
}
