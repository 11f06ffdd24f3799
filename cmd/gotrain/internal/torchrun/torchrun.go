// Package torchrun maps torchrun's command line onto gotrain launch's: the
// same flags in either spelling (--nproc_per_node, --nproc-per-node), as
// --flag=value or --flag value, with PET_* variables as their defaults, the
// way torchrun reads them. It is pure: the machine's GPU and CPU counts and
// the environment come in, gotrain launch's arguments and the notes to print
// (one for each setting accepted without effect) come out.
package torchrun

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
)

// ErrUsage marks bad command lines (gotrain exits 2 on them).
var ErrUsage = errors.New("torchrun: usage")

// Machine is what the mapping needs to know about the node.
type Machine struct {
	GPUs, CPUs int
	// GPUsHow says how GPUs was found (launcher.GPUs.How), for warnings.
	GPUsHow string
	// Getenv reads PET_* variables and GOTRAIN_* settings (os.Getenv in
	// production); nil: none.
	Getenv func(string) string
	// IsLocal says whether host (a name or an address) names this machine
	// (one of its interfaces' addresses, its hostname, a loopback
	// address); nil: only loopback addresses and "localhost" do.
	IsLocal func(host string) bool
	// CanListen says whether this node can listen at HOST:PORT now (the
	// port is free); nil: it can.
	CanListen func(hostport string) bool
	// HasSecret says that every node gets the job's secret without
	// copying: a job token in GOTRAIN_JOB_TOKEN or a token file
	// (GOTRAIN_JOB_TOKEN_FILE), or a Slurm step (munge brings it).
	HasSecret bool
	// Python is the interpreter to run scripts and modules with (an
	// absolute path); "": python3.
	Python string
	// LaunchFlags are gotrain launch's flags that a GOTRAIN_NAME variable
	// may set (name → whether it is a boolean flag); see Settings.
	LaunchFlags map[string]bool
}

// Result is gotrain launch's command line and what to tell the user.
type Result struct {
	// LaunchArgs are gotrain launch's arguments: flags, "--", program, args.
	LaunchArgs []string
	// Notes say, one each, what was accepted without effect.
	Notes []string
	// Warnings say what runs otherwise than the command line may suggest:
	// workers that get no GPU.
	Warnings []string
	// LocalToken, when not empty, is the coordinator's port on this
	// machine (a loopback endpoint, no secret given): the shell takes the
	// job token from the run file of this user's launcher whose
	// coordinator listens there (internal/runfile) and passes it on.
	LocalToken string
	// Host says that this node runs the job's coordinator.
	Host bool
	// Python says that the program runs through the interpreter
	// (Machine.Python): a script or -m, not --no-python.
	Python bool
	// TempLogDir says that the line sends output to log files (--tee,
	// --redirects, --local-ranks-filter) but names no --log-dir: the shell
	// makes a temporary one, as torchrun does, and adds --log-dir before
	// LaunchArgs' "--".
	TempLogDir bool
}

// ErrNoSecret is the refusal of a multi-node line across machines that
// gives no secret every node shares (gotrain exits 2 on it).
var ErrNoSecret = errors.New("torchrun: no job secret")

// SecretHelp says what a multi-node job without a shared secret needs.
const SecretHelp = "Every node must prove the same job secret: torchrun's own store lets anyone who reaches its port join and steer the job, gotrain's coordinator does not. " +
	"Set GOTRAIN_JOB_TOKEN to the same random value on every node (e.g. GOTRAIN_JOB_TOKEN=$(openssl rand -hex 16), passed to all nodes by your scheduler or ssh), " +
	"or GOTRAIN_JOB_TOKEN_FILE to a 0600 file all nodes read (a shared home directory); nothing else needs copying: each node proves the token over TLS and it never travels. " +
	"Under Slurm, start the line with srun: munge brings the secret. All nodes on this machine (a loopback endpoint) need nothing."

type kind int

const (
	valued kind = iota
	boolean
)

// flags are torchrun's, by their dash spelling.
var flags = map[string]kind{
	"nproc-per-node": valued, "nnodes": valued, "node-rank": valued,
	"master-addr": valued, "master-port": valued, "local-addr": valued,
	"rdzv-backend": valued, "rdzv-endpoint": valued, "rdzv-id": valued, "rdzv-conf": valued,
	"standalone": boolean, "max-restarts": valued, "monitor-interval": valued,
	"start-method": valued, "role": valued, "module": boolean, "no-python": boolean,
	"run-path": boolean, "log-dir": valued, "redirects": valued, "tee": valued,
	"local-ranks-filter": valued, "signals-to-handle": valued, "logs-specs": valued,
}

// shortFlags are torchrun's one-letter spellings (besides -m).
var shortFlags = map[string]string{"-r": "redirects", "-t": "tee"}

// shortName is a's first two characters when it is a one-dash flag.
func shortName(a string) string {
	if len(a) < 2 || a[0] != '-' || a[1] == '-' {
		return ""
	}
	return a[:2]
}

// refused are torchrun 2.x's flags that gotrain does not take, each with
// why.
var refused = map[string]string{
	"virtual-local-rank":       "every gotrain worker sees its own LOCAL_RANK and GPU; give CUDA_VISIBLE_DEVICES yourself if the program needs device 0",
	"numa-binding":             "gotrain pins each worker to its GPU's NUMA node's CPUs itself",
	"event-log-handler":        "gotrain logs to stderr and --log-dir; no event handlers",
	"log-line-prefix-template": "gotrain prefixes each line with [rank N]",
	"enable-nvtx":              "not supported",
}

// byPrefix is the one torchrun flag (or refused one) that starts with
// name, as argparse takes abbreviations: "" for none, an error for more.
func byPrefix(name string) (string, error) {
	var match []string
	for _, f := range sortedFlags() {
		if strings.HasPrefix(f, name) {
			match = append(match, f)
		}
	}
	for f := range refused {
		if strings.HasPrefix(f, name) {
			match = append(match, f)
		}
	}
	switch len(match) {
	case 0:
		return "", nil
	case 1:
		if why, ok := refused[match[0]]; ok {
			return "", usage("--%s (torchrun 2.x) is not supported: %s", match[0], why)
		}
		return match[0], nil
	}
	slices.Sort(match)
	return "", usage("--%s is ambiguous: it could be --%s", name, strings.Join(match, ", --"))
}

// noEffect says why each flag gotrain accepts without effect has none.
var noEffect = map[string]string{
	"rdzv-backend":     "gotrain's own coordinator is the rendezvous",
	"rdzv-conf":        "gotrain's coordinator takes its settings from gotrain launch's flags (--join-timeout, --rendezvous-timeout)",
	"monitor-interval": "gotrain learns of a worker's exit at once",
	"start-method":     "gotrain starts every worker as a process of its own",
	"local-addr":       "give gotrain launch --node-addr instead",
	"logs-specs":       "gotrain writes logs with --log-dir",
	"run-path":         "the script runs as python3 -u SCRIPT",
}

// forwardable are the signals gotrain launch --signals-to-handle takes;
// SIGINT and SIGTERM always stop the workers.
var forwardable = map[string]bool{"SIGUSR1": true, "SIGUSR2": true, "SIGHUP": true, "SIGQUIT": true}

func usage(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, a...))
}

// outputFlags are gotrain launch's flags for how torchrun would print the
// workers' output: raw (no prefix, the bytes as written: torchrun's way)
// when the job has one rank and nothing is teed, prefixed otherwise (with
// --tee torchrun prefixes lines too); --redirects and --local-ranks-filter
// as launch's --redirects and --console-ranks. needLogDir: some output goes
// to log files, for which torchrun makes a temporary directory when none is
// given.
func outputFlags(get func(string) (string, bool), oneRank bool) (out []string, needLogDir bool) {
	tee, _ := get("tee")
	teed := tee != "" && tee != "0"
	if oneRank && !teed {
		out = append(out, "--output", "raw")
	}
	if v, ok := get("redirects"); ok && v != "" {
		out = append(out, "--redirects", v)
		needLogDir = needLogDir || v != "0"
	}
	if v, ok := get("local-ranks-filter"); ok && v != "" {
		out = append(out, "--console-ranks", v)
		needLogDir = true
	}
	return out, needLogDir || teed
}

// notSettings are gotrain launch's flags that no GOTRAIN_NAME variable
// sets: torchrun's flags give them, or gotrain sets the variable of that
// name in every worker (GOTRAIN_BACKEND, GOTRAIN_RUN_ID, GOTRAIN_STANDBY),
// so that a gotrain torchrun inside a worker would take it for a setting.
var notSettings = map[string]bool{
	"nproc-per-node": true, "nnodes": true, "node-rank": true, "coordinator": true,
	"coordinator-listen": true, "run-id": true, "max-restarts": true, "log-dir": true,
	"signals-to-handle": true, "backend": true, "standby": true, "job-token": true,
	"output": true, "redirects": true, "console-ranks": true, "role": true, "store-port": true,
}

// joinerOnly are the settings of a node that joins a coordinator.
var joinerOnly = map[string]bool{"ca-hash": true, "tls-ca": true, "insecure-skip-ca-check": true}

// SettingEnv is the variable that sets gotrain launch's flag name in
// gotrain torchrun: GOTRAIN_ and the name in capitals, '-' as '_'
// (--ca-hash: GOTRAIN_CA_HASH).
func SettingEnv(name string) string {
	return "GOTRAIN_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// IsSetting says whether gotrain torchrun takes gotrain launch's flag
// name from its GOTRAIN_ variable.
func IsSetting(name string) bool { return !notSettings[name] }

// settings are the launch flags of m.LaunchFlags that GOTRAIN_NAME
// variables give, in name order, as --name=value.
// On the coordinator's node, how joiners verify the coordinator
// (GOTRAIN_CA_HASH, GOTRAIN_TLS_CA) does not apply: the same environment
// can then be given to every node.
func settings(m Machine, mapped []string, host bool) []string {
	if m.Getenv == nil {
		return nil
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(m.LaunchFlags)) {
		if !IsSetting(name) || slices.Contains(mapped, "--"+name) || host && joinerOnly[name] {
			continue
		}
		v := m.Getenv(SettingEnv(name))
		if v == "" {
			continue
		}
		if m.LaunchFlags[name] { // boolean: 1, true, yes
			v = strconv.FormatBool(v == "1" || strings.EqualFold(v, "true") || strings.EqualFold(v, "yes"))
		}
		out = append(out, "--"+name+"="+v)
	}
	return out
}

// isLoopback says whether host is "localhost" or a loopback address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// flagOrder lists the flags given on the command line, then those that
// only a PET_* variable gave, in a stable order.
func flagOrder(given []string, getenv func(string) string) []string {
	out := append([]string(nil), given...)
	if getenv == nil {
		return out
	}
	seen := map[string]bool{}
	for _, g := range given {
		seen[g] = true
	}
	for _, name := range sortedFlags() {
		if !seen[name] && getenv("PET_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) != "" {
			out = append(out, name)
		}
	}
	return out
}

func sortedFlags() []string { return slices.Sorted(maps.Keys(flags)) }

// Flags lists torchrun's flags gotrain torchrun knows, by their dash
// spelling: those it takes and those it refuses with a reason.
func Flags() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for f := range flags {
			if !yield(f) {
				return
			}
		}
		for f := range refused {
			if !yield(f) {
				return
			}
		}
	})
}

// flagName is a's name, as Go's flag package writes it in errors.
func flagName(a string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
	return name
}

// IsFlag says whether name (either spelling, without dashes; "m" is
// --module) is one of torchrun's flags.
func IsFlag(name string) bool {
	if name == "m" {
		return true
	}
	_, ok := flags[strings.ReplaceAll(name, "_", "-")]
	return ok
}
