package pyinterp

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestImportsTorch(t *testing.T) {
	for src, want := range map[string]bool{
		"import torch\n":                          true,
		"import torch.distributed as dist\n":      true,
		"import os, torch\n":                      true,
		"import os as o, torch.nn\n":              true,
		"from torch import nn\n":                  true,
		"from torch.nn.parallel import DDP\n":     true,
		"if x:\n    import torch\n":               true,
		"import torchvision\n":                    false,
		"import os\n# import torch later\n":       false,
		"print('import torch')\n":                 false,
		"from torchmetrics import Accuracy\n":     false,
		"import numpy as np\nimport sys, torch\n": true,
		"x = 1\n\tfrom torch.utils import data\n": true,
	} {
		p := filepath.Join(t.TempDir(), "s.py")
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := ImportsTorch(p); got != want {
			t.Errorf("ImportsTorch(%q) = %v, want %v", src, got, want)
		}
	}
	if ImportsTorch(filepath.Join(t.TempDir(), "missing.py")) {
		t.Error("a missing script imports torch")
	}
}

// The rule in order, with the environment decided by the test.
func TestChoose(t *testing.T) {
	dir := t.TempDir()
	exe := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pathPy := exe("python3", "#!/bin/sh\n")
	torchPy := exe("torchpython", "#!/bin/sh\n")
	torchrun := exe("torchrun", "#!"+torchPy+"\n")
	base := func(env map[string]string, onPath map[string]string, withTorch ...string) Env {
		return Env{
			Getenv: func(k string) string { return env[k] },
			Self:   "gotrain",
			LookPath: func(n string) (string, error) {
				if p, ok := onPath[n]; ok {
					return p, nil
				}
				if strings.Contains(n, "/") {
					return n, nil
				}
				return "", errors.New("not found")
			},
			HasTorch: func(py string) bool {
				for _, w := range withTorch {
					if w == py {
						return true
					}
				}
				return false
			},
			IsSelf: func(string) bool { return false },
			Escape: "-- python3 s.py",
		}
	}
	for _, tc := range []struct {
		name       string
		env        Env
		needsTorch bool
		want, why  string
		wantErr    string
	}{
		{"PYTHON_EXEC first", base(map[string]string{"PYTHON_EXEC": torchPy}, map[string]string{"python3": pathPy}), true, torchPy, "$PYTHON_EXEC", ""},
		{"no torch needed: PATH", base(nil, map[string]string{"python3": pathPy, "torchrun": torchrun}, torchPy), false, pathPy, "PATH", ""},
		{"torch: torchrun's interpreter", base(nil, map[string]string{"python3": pathPy, "torchrun": torchrun}, torchPy, pathPy), true, torchPy, "the interpreter of " + torchrun + ", which has torch", ""},
		{"torch: PATH's when torchrun's lacks it", base(nil, map[string]string{"python3": pathPy, "torchrun": torchrun}, pathPy), true, pathPy, "PATH, which has torch", ""},
		{"torch: none has it", base(nil, map[string]string{"python3": pathPy}), true, "", "", "PATH's python3 (" + pathPy + ") cannot import torch"},
		{"no python3", base(nil, nil), false, "", "", "no python3 in PATH"},
	} {
		c, err := Choose(tc.env, tc.needsTorch)
		if tc.wantErr != "" {
			var pe *Error
			if !errors.As(err, &pe) || !strings.Contains(pe.Msg, tc.wantErr) || !strings.Contains(pe.Hint, "PYTHON_EXEC") {
				t.Errorf("%s: %v, want an *Error %q with a hint naming PYTHON_EXEC", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || c.Path != tc.want || c.Why != tc.why {
			t.Errorf("%s: %+v, %v; want %s (%s)", tc.name, c, err, tc.want, tc.why)
		}
	}
}
