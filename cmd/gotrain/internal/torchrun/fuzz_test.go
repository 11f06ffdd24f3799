package torchrun

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// Any torchrun command line maps or is refused with a usage error (or, for
// a multi-node line with no secret, ErrNoSecret); never a panic. A mapped
// line ends with "--", the program and the script's own arguments
// unchanged.
func FuzzMap(f *testing.F) {
	for _, s := range []string{
		"train.py", "--nproc_per_node=2 --standalone train.py --epochs 3", "-m pkg.train --lr 1",
		"--no-python ./train x", "--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint head:29400 t.py",
		"--nnodes=2 --node_rank=1 --master_addr=10.0.0.1 --master_port=29500 t.py",
		"-r 0:1 -t3 --log-dir /l t.py", "--nproc=2 --max_r 3 --stand t.py", "--tee", "-- t.py --nnodes 2",
		"--signals-to-handle SIGUSR1,TERM t.py", "--standalone --nnodes=1:2 t.py",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, line string, secret bool) {
		args := strings.Split(line, " ")
		m := Machine{GPUs: 2, CPUs: 8, HasSecret: secret, Getenv: func(string) string { return "" }}
		r, err := Map(args, m)
		if err != nil {
			if !errors.Is(err, ErrUsage) && !errors.Is(err, ErrNoSecret) {
				t.Fatalf("Map(%q): %v is neither a usage error nor ErrNoSecret", args, err)
			}
			return
		}
		cl, err := scan(args)
		if err != nil {
			t.Fatalf("Map(%q) mapped what scan refuses: %v", args, err)
		}
		la := r.LaunchArgs
		n := len(la) - len(cl.scriptArgs)
		if n < 2 || !slices.Equal(la[n:], cl.scriptArgs) || la[n-1] != cl.script {
			t.Fatalf("Map(%q) = %q: want it to end with the script %q and its arguments %q", args, la, cl.script, cl.scriptArgs)
		}
		prog := 1 // --no-python: the script is the program
		if r.Python {
			prog = 3 // python3 -u SCRIPT
			if la[n-2] == "-m" {
				prog = 4
			}
		}
		if n-prog-1 < 0 || la[n-prog-1] != "--" {
			t.Fatalf("Map(%q) = %q: no -- before the program", args, la)
		}
	})
}
