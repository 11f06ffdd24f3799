package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// helpFlags returns the flags a command's --help lists.
func helpFlags(t *testing.T, bin, cmd string) []string {
	t.Helper()
	stdout, _, code := runGotrain(t, bin, cmd, "--help-all")
	if code != 0 { // a command whose --help is all there is
		stdout, _, _ = runGotrain(t, bin, cmd, "--help")
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  --?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(stdout, -1) {
		names = append(names, m[1])
	}
	return names
}

// checkHintFlags fails t when text names a gotrain command with a flag that
// the command does not have ("gotrain launch --backend cpu": launch must
// have --backend).
func checkHintFlags(t *testing.T, bin, text string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`gotrain ([a-z]+)([^;.]*)`).FindAllStringSubmatch(text, -1) {
		have := helpFlags(t, bin, m[1])
		if len(have) == 0 {
			t.Errorf("%q names gotrain %s, which has no flags or is no command", text, m[1])
		}
		for _, f := range regexp.MustCompile(`(?:^|\s)--?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(have, f[1]) {
				t.Errorf("%q: gotrain %s has no --%s", text, m[1], f[1])
			}
		}
	}
}

// Every command in the command table (so a new one is covered too) prints
// its help on stdout and exits 0, however help is asked for; each flag's
// line shows at most a one-word value type (flag.UnquoteUsage takes
// back-quoted text of the help for it).
func TestHelpEveryCommand(t *testing.T) {
	bin := buildBinary(t)
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		stdout, stderr, code := runGotrain(t, bin, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage: gotrain <command>") {
			t.Errorf("gotrain %s: exit %d, stderr %q, stdout %q; want the command list on stdout, exit 0", strings.Join(args, " "), code, stderr, stdout)
		}
	}
	flagLine := regexp.MustCompile(`^  --[a-z][a-z0-9-]*( [a-zA-Z0-9|:]+)?$`)
	for _, c := range commands() {
		for _, args := range [][]string{{c.name(), "--help"}, {c.name(), "-h"}, {c.name(), "-help"}, {"help", c.name()}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				stdout, stderr, code := runGotrain(t, bin, args...)
				if code != 0 || stderr != "" {
					t.Errorf("exit %d, stderr %q; want exit 0, nothing on stderr", code, stderr)
				}
				if !strings.HasPrefix(stdout, "Usage: gotrain "+c.name()) {
					t.Errorf("stdout does not start with the usage:\n%s", stdout)
				}
				_, flags, ok := strings.Cut(stdout, "\nFlags:\n")
				if !ok && c.name() != "version" {
					t.Fatalf("no Flags: section:\n%s", stdout)
				}
				n := 0
				for _, l := range strings.Split(flags, "\n") {
					if strings.HasPrefix(l, "  --") {
						n++
						if !flagLine.MatchString(l) {
							t.Errorf("flag line %q: want '  --name' and at most a one-word value type", l)
						}
					}
				}
				if n == 0 && c.name() != "version" {
					t.Errorf("no flags listed:\n%s", stdout)
				}
			})
		}
	}
}

// Usage errors say what is wrong on stderr, print nothing on stdout and
// exit 2, for every command.
func TestUsageErrors(t *testing.T) {
	bin := buildBinary(t)
	type tc struct {
		args []string
		want string // on stderr; "re:" and a regular expression, or the text
	}
	cases := []tc{
		{nil, "Usage: gotrain <command>"},
		{[]string{"no-such-command"}, `unknown command "no-such-command"`},
		{[]string{"help", "no-such-command"}, `unknown command "no-such-command"`},
	}
	for _, c := range commands() {
		cases = append(cases, tc{[]string{c.name(), "--no-such-flag"}, "unknown flag --no-such-flag"})
	}
	cases = append(cases, []tc{
		{[]string{"launch", "--backend", "cpu", "--", "true"}, "no NVIDIA GPU found on this machine"}, // no count, no GPUs
		{[]string{"launch", "--nproc-per-node", "0", "--", "true"}, "--nproc-per-node 0\nGive 1 or more workers"},
		{[]string{"launch", "--gpus", "-2", "--", "true"}, "--gpus -2\nGive 1 or more workers"},
		{[]string{"launch", "--nproc-per-node", "1"}, "no program given"},
		{[]string{"launch", "--nproc-per-node", "x", "--", "true"}, `invalid value "x" for --nproc-per-node: want a number of workers, auto, gpu or cpu`},
		{[]string{"launch", "--nproc-per-nod", "2", "--", "true"}, "unknown flag --nproc-per-nod\nDid you mean --nproc-per-node?"},
		{[]string{"launch", "--max_restart", "2", "--", "true"}, "unknown flag --max_restart\nDid you mean --max-restarts?"},
		{[]string{"launch", "--grace-period", "30", "--", "true"}, "--grace-period 30: not a duration\nGive a unit, e.g. --grace-period 30s"},
		{[]string{"launch", "--join-timeout", "soon", "--", "true"}, "--join-timeout soon: not a duration\nGive a duration with a unit"},
		{[]string{"launch", "--nproc-per-node", "gpu", "--", "true"}, "--nproc-per-node gpu, but this machine has no NVIDIA GPU"},
		{[]string{"torchrun", "--nproc_per_nodes=2", "t.py"}, "unknown flag --nproc_per_nodes\nDid you mean --nproc-per-node?"},
		{[]string{"coordinator", "--nnode", "2"}, "unknown flag --nnode\nDid you mean --nnodes?"},
		{[]string{"coordinator", "--restart-backoff", "2"}, "--restart-backoff 2: not a duration\nGive a unit, e.g. --restart-backoff 2s"},
		{[]string{"launch", "--nnodes", "0", "--", "true"}, `re:nnodes.*(\nGive at least 1|want N or MIN:MAX with 1 <= MIN)`},
		{[]string{"launch", "--max-restarts", "-1", "--", "true"}, "--max-restarts -1\nGive 0 or more"},
		{[]string{"launch", "--restart-backoff", "-1s", "--", "true"}, "--restart-backoff -1s\nGive a duration of 0 or more"},
		{[]string{"launch", "--hang-timeout", "-1s", "--", "true"}, "--hang-timeout -1s\nGive a positive duration"},
		{[]string{"launch", "--rendezvous-timeout", "-1m", "--", "true"}, "--rendezvous-timeout -1m0s\nGive a duration of 0 or more"},
		{[]string{"launch", "--on-hang", "explode", "--", "true"}, `--on-hang "explode"`},
		{[]string{"launch", "--on-straggler", "kill", "--", "true"}, `--on-straggler "kill"` + "\nUse --on-straggler report (name it only) or --on-straggler replace"},
		{[]string{"launch", "--nproc-per-node", "1", "--grace-period", "-1s", "--", "true"}, "--grace-period -1s\nGive a duration of 0 or more"},
		{[]string{"launch", "--nproc-per-node", "1", "--join-timeout", "0s", "--", "true"}, "--join-timeout 0s\nGive a positive duration"},
		{[]string{"launch", "--nproc-per-node", "1", "--standby-timeout", "-1s", "--", "true"}, "--standby-timeout -1s\nGive a positive duration"},
		{[]string{"launch", "--nproc-per-node", "1", "--gossip-port", "70000", "--", "true"}, "--gossip-port 70000\nGive a port from 1 to 65535, or 0"},
		{[]string{"launch", "--nproc-per-node", "1", "--coordinator", "host:0", "--", "true"}, `--coordinator "host:0": port "0"` + "\nGive a port from 1 to 65535"},
		{[]string{"launch", "--nproc-per-node", "1", "--coordinator", "host:70000", "--", "true"}, `--coordinator "host:70000": port "70000"`},
		{[]string{"launch", "--nproc-per-node", "1", "--coordinator-listen", "0.0.0.0:65536", "--", "true"}, `--coordinator-listen "0.0.0.0:65536": port "65536"` + "\nGive a port from 0 to 65535"},
		{[]string{"launch", "--nproc-per-node", "1", "--metrics-addr", ":-1", "--", "true"}, `--metrics-addr ":-1": port "-1"`},
		{[]string{"launch", "--nproc-per-node", "1", "--backend", "tpu", "--", "true"}, `--backend "tpu"` + "\nUse --backend cpu or --backend nccl."},
		{[]string{"launch", "--standby=sometimes", "--", "true"}, "--standby takes on, off or auto: write e.g. --standby=off"},
		{[]string{"coordinator", "--nnodes", "0"}, `re:nnodes.*(\nGive at least 1|want N or MIN:MAX with 1 <= MIN)`},
		{[]string{"coordinator", "--max-restarts", "-1"}, "--max-restarts -1\nGive 0 or more"},
		{[]string{"coordinator", "--gossip-port", "-5"}, "--gossip-port -5\nGive a port"},
		{[]string{"coordinator", "--listen", "0.0.0.0:99999"}, `--listen "0.0.0.0:99999": port "99999"`},
		{[]string{"coordinator", "extra"}, `unexpected argument "extra"`},
		{[]string{"bench"}, "no collective given"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--gpus", "0"}, "--gpus 0\nGive 1 or more ranks"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--iters", "0"}, "--iters is 0, want at least 1"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--warmup", "-1"}, "--warmup is -1, want 0 or more"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--factor", "1"}, "--factor is 1, want at least 2"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--timeout", "-1s"}, "--timeout -1s\nGive a positive duration"},
		{[]string{"bench", "allreduce", "--backend", "cpu", "--max", "lots"}, "--max: "},
		{[]string{"bench", "--backend", "cpu", "allreduce", "extra"}, `unexpected argument "extra"`},
		{[]string{"bench", "broadcast", "--backend", "cpu", "--root", "2"}, "--root 2 is out of range for 2 ranks"},
		{[]string{"diagnose", "--stack-lines", "-1"}, "--stack-lines -1\nGive 0 or more"},
		{[]string{"diagnose", "--coordinator", "h:123456"}, `--coordinator "h:123456": port "123456"`},
		{[]string{"top", "--interval", "0s"}, "--interval 0s\nGive a positive duration"},
		{[]string{"top", "--coordinator", "nohost"}, `--coordinator "nohost" is not HOST:PORT`},
		{[]string{"topo", "extra"}, `unexpected argument "extra"`},
		{[]string{"doctor", "extra"}, `unexpected argument "extra"`},
		{[]string{"version", "extra"}, `unexpected argument "extra"`},
	}...)
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			if len(c.args) > 2 && c.args[0] == "launch" && (c.args[1] == "--backend" || c.args[2] == "gpu") && hasGPUDevices() {
				t.Skip("this machine has GPUs")
			}
			stdout, stderr, code := runGotrain(t, bin, c.args...)
			re := regexp.MustCompile(regexp.QuoteMeta(c.want))
			if expr, ok := strings.CutPrefix(c.want, "re:"); ok {
				re = regexp.MustCompile(expr)
			}
			if code != 2 || stdout != "" || !re.MatchString(stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, stderr with %q", code, stdout, stderr, c.want)
			}
		})
	}
}

func hasGPUDevices() bool {
	m, _ := filepath.Glob("/dev/nvidia[0-9]*")
	return len(m) > 0
}

// A switch followed by one of its words takes it; values of other flags
// and the program's own arguments are left alone.
func TestJoinFlagWords(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var mode standbyFlag
	fs.Var(&mode, "standby", "")
	fs.Bool("json", false, "")
	fs.String("backend", "", "")
	for _, tc := range []struct{ in, want string }{
		{"--standby off -- prog", "--standby=off -- prog"},
		{"-standby on prog", "-standby=on prog"},
		{"--standby auto --json false", "--standby=auto --json=false"},
		{"--standby -- off", "--standby -- off"},
		{"--standby prog off", "--standby prog off"},
		{"--standby=on off", "--standby=on off"},
		{"--backend off --standby", "--backend off --standby"},
		{"--backend --standby off", "--backend --standby off"}, // --standby is --backend's value
		{"prog --standby off", "prog --standby off"},
		{"--json true --unknown off", "--json=true --unknown off"},
		{"--standby", "--standby"},
	} {
		if got := strings.Join(joinFlagWords(fs, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("joinFlagWords(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// --standby off (with a space) is the mode, not the program: the job runs
// `true` and succeeds.
func TestStandbyWordNotProgram(t *testing.T) {
	bin := buildBinary(t)
	for _, mode := range []string{"off", "on", "auto"} {
		stdout, stderr, code := runGotrain(t, bin, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--standby", mode, "--", "sh", "-c", "echo ran")
		if code != 0 || !strings.Contains(stdout, "ran") {
			t.Errorf("--standby %s: exit %d, stdout %q, stderr %q; want the program to run, exit 0", mode, code, stdout, stderr)
		}
	}
}
