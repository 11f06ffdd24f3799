package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/torchrun"
	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/launcher"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/help/*.txt from the binary's --help")

// launch, coordinator and torchrun --help, as a person reads them, are
// testdata/help/COMMAND.txt (go test -run TestHelpGolden -rewrite).
func TestHelpGolden(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range []string{"launch", "launch --help-all", "coordinator", "torchrun"} {
		t.Run(c, func(t *testing.T) {
			args := strings.Fields(c)
			if len(args) == 1 {
				args = append(args, "--help")
			}
			cmd := exec.CommandContext(t.Context(), bin, args...)
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
				return strings.HasPrefix(kv, "GOTRAIN_") || strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "PET_")
			})
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "help", strings.ReplaceAll(strings.TrimSuffix(c, " --help"), " --", "-")+".txt")
			if *rewrite {
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != string(want) {
				t.Errorf("gotrain %s --help differs from %s (go test -run TestHelpGolden -rewrite rewrites it):\n%s", c, path, out)
			}
			if strings.Contains(string(out), "\n"+groupOther+":\n") {
				t.Errorf("gotrain %s --help has flags in no group: add them to its groups in help.go", c)
			}
		})
	}
}

// Every flag of launch, coordinator and torchrun is in one group, and
// every name a group gives is a flag; the essentials come first.
func TestHelpGroupsCoverFlags(t *testing.T) {
	var hc host.Config
	for _, tc := range []struct {
		fs     *flag.FlagSet
		groups []flagGroup
	}{
		{launchFlags(new(launcher.Config), new(launchOpts)), launchGroups},
		{coordinatorFlags(&hc, new(string)), coordinatorGroups},
		{torchrunFlags(), torchrunGroups},
	} {
		seen := map[string]bool{}
		for _, g := range tc.groups {
			for _, n := range g.names {
				if tc.fs.Lookup(n) == nil {
					t.Errorf("%s: group %q names --%s, which is no flag", tc.fs.Name(), g.title, n)
				}
				if seen[n] {
					t.Errorf("%s: --%s is in two groups", tc.fs.Name(), n)
				}
				seen[n] = true
			}
		}
		tc.fs.VisitAll(func(f *flag.Flag) {
			if !seen[f.Name] && f.Name != helpAll {
				t.Errorf("%s: --%s is in no group", tc.fs.Name(), f.Name)
			}
		})
		if got := groupFlags(tc.fs, tc.groups)[0].title; got != groupEssentials {
			t.Errorf("%s: first group %q, want %q", tc.fs.Name(), got, groupEssentials)
		}
	}
}

// gotrain launch --help is short enough to read at once: its essentials,
// with examples, in at most 60 lines; --help-all has the rest.
func TestLaunchHelpIsShort(t *testing.T) {
	bin := buildBinary(t)
	short, _, code := runGotrain(t, bin, "launch", "--help")
	all, _, codeAll := runGotrain(t, bin, "launch", "--help-all")
	if code != 0 || codeAll != 0 {
		t.Fatalf("exit %d and %d, want 0", code, codeAll)
	}
	if n := strings.Count(short, "\n"); n > 60 {
		t.Errorf("gotrain launch --help is %d lines, want at most 60", n)
	}
	for _, want := range []string{"Examples:", "--nproc-per-node", "gotrain launch --help-all"} {
		if !strings.Contains(short, want) {
			t.Errorf("gotrain launch --help lacks %q", want)
		}
	}
	launchFlags(new(launcher.Config), new(launchOpts)).VisitAll(func(f *flag.Flag) {
		if f.Name != helpAll && !strings.Contains(all, "  --"+f.Name+"\n") && !strings.Contains(all, "  --"+f.Name+" ") {
			t.Errorf("gotrain launch --help-all does not list --%s", f.Name)
		}
	})
}

// --help never shows the job token from the environment as a default.
func TestHelpHidesToken(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range []string{"launch", "coordinator"} {
		cmd := exec.CommandContext(t.Context(), bin, c, "--help")
		cmd.Env = append(os.Environ(), "GOTRAIN_JOB_TOKEN=sekrit-token-value")
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "sekrit-token-value") {
			t.Errorf("gotrain %s --help prints the job token", c)
		}
	}
}

// torchrun's flags given to gotrain launch are answered, through the real
// binary, with exit 2 and the command line for gotrain torchrun (which
// must then parse) and gotrain launch's spelling.
func TestTorchrunSpellingsUnderLaunch(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		args []string
		want []string // on stderr, in order
	}{
		{[]string{"--standalone", "--nproc_per_node", "2", "--", "train.py", "--epochs", "3"}, []string{
			"gotrain launch: --standalone is torchrun's flag, not gotrain launch's\n",
			"\n  gotrain torchrun --standalone --nproc_per_node 2 train.py --epochs 3\n",
			"\n  gotrain launch --nproc-per-node 2 ",
			"-- python3 -u train.py --epochs 3\n",
			"instead of --standalone: leave it out",
		}},
		{[]string{"--master_port", "29500", "--nnodes=2", "--", "train.py"}, []string{
			"--master_port is torchrun's flag", "gotrain torchrun --master_port 29500 --nnodes=2 train.py\n",
			"--coordinator-listen 0.0.0.0:PORT on the first node",
		}},
		{[]string{"--master-addr", "10.0.0.1", "--master-port", "29500", "--nnodes=2", "--", "train.py"}, []string{"--master-addr is torchrun's flag", "--coordinator 10.0.0.1:29500"}},
		{[]string{"--rdzv_endpoint", "h:29400", "--nnodes", "2", "--", "./train"}, []string{"gotrain torchrun --rdzv_endpoint h:29400 --nnodes 2 --no-python ./train\n", "--coordinator h:29400"}},
		{[]string{"--rdzv-backend", "c10d", "--", "train.py"}, []string{"--rdzv-backend is torchrun's flag", "gotrain's coordinator is the rendezvous"}},
		{[]string{"--tee", "3", "--", "train.py"}, []string{"--tee is torchrun's flag", "prefixed [rank N]"}},
		{[]string{"-m", "pkg.train"}, []string{"-m is torchrun's flag", "gotrain torchrun -m pkg.train\n", "-- python3 -u -m pkg.train\n"}},
		// With gotrain launch's own flags too, torchrun's line would not parse: launch's spelling only.
		{[]string{"--standalone", "--standby", "off", "--", "train.py"}, []string{"--standalone is torchrun's flag", "torchrun's flags only, then the script", "leave it out"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			stdout, stderr, code := runGotrain(t, bin, append([]string{"launch"}, tc.args...)...)
			if code != 2 || stdout != "" {
				t.Fatalf("exit %d, stdout %q; want exit 2, nothing on stdout", code, stdout)
			}
			rest := stderr
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("stderr lacks %q (after the earlier ones):\n%s", w, stderr)
				}
				rest = rest[i+len(w):]
			}
			// The torchrun line it gives is one gotrain torchrun takes.
			for _, l := range strings.Split(stderr, "\n") {
				if line, ok := strings.CutPrefix(l, "  gotrain torchrun "); ok {
					if _, err := torchrun.Map(strings.Fields(line), torchrun.Machine{CPUs: 2, HasSecret: true}); err != nil {
						t.Errorf("the torchrun line %q does not parse: %v", line, err)
					}
				}
			}
		})
	}
}

func TestEditDistanceAndNearest(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "abc", 0}, {"nnode", "nnodes", 1}, {"backedn", "backend", 2}, {"kitten", "sitting", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
	fs := launchFlags(new(launcher.Config), new(launchOpts))
	for in, want := range map[string]string{
		"backedn": "backend", "gpu": "gpus", "max_restart": "max-restarts", "nproc": "nproc-per-node",
		"log-dri=x": "log-dir", "xyz": "", "standalone": "", "zzzzzzzzzz": "",
	} {
		if got := nearestFlag(fs, in); got != want {
			t.Errorf("nearestFlag(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every command's --help shows examples.
func TestHelpHasExamples(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range commands() {
		out, _, code := runGotrain(t, bin, c.name(), "--help")
		if code != 0 || !strings.Contains(out, "\nExamples:\n") {
			t.Errorf("gotrain %s --help (exit %d) has no Examples: section", c.name(), code)
		}
	}
}
