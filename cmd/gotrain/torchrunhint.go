package main

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/torchrun"
	"github.com/gotrain/gotrain/internal/launcher/placement"
)

// A torchrun user's command line given to gotrain launch (--standalone,
// --master_port, -m, ...) is answered with the same command line for gotrain
// torchrun, which takes it as it is, and gotrain launch's own spelling.

// launchSpelling says, for torchrun's flags that gotrain launch lacks,
// what gotrain launch takes instead.
var launchSpelling = map[string]string{
	"standalone":         "leave it out: gotrain launch on one node runs its own coordinator",
	"master-addr":        "--coordinator HOST:PORT on the nodes that join (the first node leaves it out)",
	"rdzv-endpoint":      "--coordinator HOST:PORT on the nodes that join (the first node leaves it out)",
	"master-port":        "--coordinator-listen 0.0.0.0:PORT on the first node, --coordinator HOST:PORT on the others",
	"rdzv-backend":       "leave it out: gotrain's coordinator is the rendezvous",
	"rdzv-conf":          "leave it out: gotrain's coordinator is the rendezvous (--join-timeout, --rendezvous-timeout)",
	"rdzv-id":            "--run-id ID",
	"tee":                "leave it out: every rank's output is printed, prefixed [rank N]; --log-dir DIR also writes each rank's log",
	"local-ranks-filter": "--console-ranks LIST with --log-dir DIR (the other ranks' output goes to their logs only)",
	"module":             "run the module as the program: -- python3 -m MODULE",
	"m":                  "run the module as the program: -- python3 -m MODULE",
	"no-python":          "leave it out: gotrain launch runs PROGRAM itself",
	"local-addr":         "--node-addr ADDR",
}

// torchrunSpelling returns the usage error for torchrun's flag name given
// to gotrain launch with args, or nil when name is not torchrun's.
func torchrunSpelling(name string, args []string) *usageError {
	name = strings.SplitN(name, "=", 2)[0]
	if !torchrun.IsFlag(name) {
		return nil
	}
	dashed := strings.ReplaceAll(name, "_", "-")
	dash := "--"
	if name == "m" {
		dash = "-"
	}
	ue := &usageError{msg: fmt.Sprintf("%s%s is torchrun's flag, not gotrain launch's", dash, name)}
	var hint []string
	tr := torchrunArgs(args)
	gpus := placement.FindGPUs()
	if r, err := torchrun.Map(tr, torchrun.Machine{GPUs: gpus.N, GPUsHow: gpus.How, CPUs: runtime.NumCPU(), HasSecret: true}); err == nil {
		hint = append(hint, "gotrain torchrun takes torchrun's command line as it is:",
			"  gotrain torchrun "+shellJoin(tr),
			"or, the same with gotrain launch's flags:",
			"  gotrain launch "+shellJoin(r.LaunchArgs))
	} else {
		hint = append(hint, "gotrain torchrun takes torchrun's command line as it is (torchrun's flags only, then the script).")
	}
	if s, ok := launchSpelling[dashed]; ok {
		hint = append(hint, fmt.Sprintf("For gotrain launch, instead of %s%s: %s.", dash, name, s))
	}
	ue.hint = strings.Join(hint, "\n")
	return ue
}

// torchrunArgs turns gotrain launch's arguments into torchrun's: the
// flags, then the script (a program that is no .py script after
// --no-python) and its arguments, without launch's "--".
func torchrunArgs(args []string) []string {
	for i, a := range args {
		if a != "--" {
			continue
		}
		out := append([]string{}, args[:i]...)
		rest := args[i+1:]
		if len(rest) > 0 && !strings.HasSuffix(rest[0], ".py") {
			noPython := false
			for _, f := range out {
				noPython = noPython || strings.ReplaceAll(strings.TrimLeft(f, "-"), "_", "-") == "no-python"
			}
			if !noPython {
				out = append(out, "--no-python")
			}
		}
		return append(out, rest...)
	}
	return args
}

// shellJoin writes args as a shell command line, quoting what needs it.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>()*?[]#~!{}") {
			q[i] = strconv.Quote(a)
		}
	}
	return strings.Join(q, " ")
}
