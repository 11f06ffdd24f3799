package snaptier

import (
	"slices"
	"testing"
)

func TestPythonPath(t *testing.T) {
	for _, c := range []struct {
		env  []string
		dir  string
		want []string
	}{
		{[]string{"A=1"}, "", []string{"A=1"}},
		{[]string{"A=1"}, "/s/python", []string{"A=1", "PYTHONPATH=/s/python"}},
		{[]string{"PYTHONPATH=/mine", "A=1"}, "/s/python", []string{"PYTHONPATH=/mine:/s/python", "A=1"}},
		{[]string{"PYTHONPATH="}, "/s/python", []string{"PYTHONPATH=/s/python"}},
	} {
		in := slices.Clone(c.env)
		if got := PythonPath(in, c.dir); !slices.Equal(got, c.want) {
			t.Errorf("PythonPath(%q, %q) = %q, want %q", c.env, c.dir, got, c.want)
		}
		if !slices.Equal(in, c.env) {
			t.Errorf("the caller's env changed: %q", in)
		}
	}
}
