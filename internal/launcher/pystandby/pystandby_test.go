package pystandby

import (
	"reflect"
	"strings"
	"testing"
)

func TestParsePython(t *testing.T) {
	for _, tc := range []struct {
		program string
		args    []string
		want    *Program
		cold    string // a part of the reason; "" when it can be warmed
	}{
		{"/usr/bin/python3", []string{"train.py", "--lr", "0.1"}, &Program{path: "train.py", args: []string{"--lr", "0.1"}}, ""},
		{"python", []string{"-u", "train.py"}, &Program{options: []string{"-u"}, path: "train.py", args: []string{}}, ""},
		{"/opt/venv/bin/python3.11", []string{"-u", "-m", "pkg.train", "x"}, &Program{options: []string{"-u"}, module: "pkg.train", args: []string{"x"}}, ""},
		{"python3", []string{"-um", "mod"}, &Program{options: []string{"-u"}, module: "mod", args: []string{}}, ""},
		{"python3", []string{"-mmod", "a"}, &Program{module: "mod", args: []string{"a"}}, ""},
		{"python3", []string{"-X", "dev", "-Wignore", "-OB", "s.py"}, &Program{options: []string{"-X", "dev", "-Wignore", "-OB"}, path: "s.py", args: []string{}}, ""},
		{"python3", []string{"-W", "error", "--", "-odd.py"}, &Program{options: []string{"-W", "error"}, path: "-odd.py", args: []string{}}, ""},
		{"python3", []string{"-c", "print(1)"}, nil, "-c runs a command string"},
		{"python3", []string{"-i", "s.py"}, nil, "-i (interactive"},
		{"python3", []string{"-"}, nil, "stdin"},
		{"python3", []string{"-u"}, nil, "no script or module"},
		{"python3", []string{"-m"}, nil, "no module after -m"},
		{"python3", []string{"--help"}, nil, "--help cannot be pre-warmed"},
		{"python3", []string{"-Z", "s.py"}, nil, "-Z cannot be pre-warmed"},
		{"./train", []string{"x.py"}, nil, ""},
		{"/usr/bin/pythonista", []string{"x.py"}, nil, ""},
	} {
		got, cold := Parse(tc.program, tc.args)
		if got != nil && got.args == nil {
			got.args = []string{}
		}
		if tc.want != nil && tc.want.args == nil {
			tc.want.args = []string{}
		}
		if !reflect.DeepEqual(got, tc.want) || (tc.cold == "") != (cold == "") || !strings.Contains(cold, tc.cold) {
			t.Errorf("Parse(%s, %q) = %+v, %q; want %+v, %q", tc.program, tc.args, got, cold, tc.want, tc.cold)
		}
	}
}

// The bootstrap is the one embedded, and takes its arguments after -c.
func TestPyStandbyCommand(t *testing.T) {
	py := &Program{options: []string{"-u", "-X", "dev"}, path: "s.py"}
	got := py.command(1, []string{"lightning", "numpy"})
	want := []string{"-u", "-X", "dev", "-c", pyBootstrap, "3", "1", "lightning,numpy"}
	if !reflect.DeepEqual(got, want) || !strings.Contains(pyBootstrap, "def _gotrain_standby():") {
		t.Errorf("command = %q", got)
	}
}
