package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The interpreter gotrain torchrun runs scripts and modules with, chosen as
// torchrun's own would be (torchrun runs sys.executable, the Python it is
// installed in, unless $PYTHON_EXEC says otherwise):
//
//  1. $PYTHON_EXEC;
//  2. the venv of the torchrun symlink gotrain was started as (a python3
//     or python beside it in the venv's bin directory);
//  3. the interpreter of PyTorch's own torchrun script on PATH (its #!
//     line), which is the Python that has torch;
//  4. PATH's python3, which must import torch: a pyenv shim or an
//     unactivated venv first in PATH often does not, and then the error says
//     so instead of every rank failing at `import torch`.
//
// The choice is printed once.

// pythonChoice is the chosen interpreter and why.
type pythonChoice struct{ path, why string }

// choosePython picks the interpreter. self is how gotrain was started
// (os.Args[0]); hasTorch checks an interpreter.
func choosePython(getenv func(string) string, self string, hasTorch func(py string) bool) (pythonChoice, error) {
	if p := getenv("PYTHON_EXEC"); p != "" {
		full, err := exec.LookPath(p)
		if err != nil {
			return pythonChoice{}, &usageError{msg: fmt.Sprintf("PYTHON_EXEC=%s: %v", p, err), hint: "Set PYTHON_EXEC to the Python interpreter that has torch (a path, or a command on PATH), or unset it."}
		}
		return pythonChoice{full, "$PYTHON_EXEC"}, nil
	}
	if filepath.Base(self) == "torchrun" {
		link := self
		if !strings.Contains(self, "/") {
			if p, err := exec.LookPath(self); err == nil {
				link = p
			}
		}
		dir := filepath.Dir(link)
		if _, err := os.Stat(filepath.Join(dir, "..", "pyvenv.cfg")); err == nil {
			for _, n := range []string{"python3", "python"} {
				if p := filepath.Join(dir, n); isExecutable(p) {
					return pythonChoice{p, "the venv of " + link}, nil
				}
			}
		}
	}
	if p, err := exec.LookPath("torchrun"); err == nil && !isGotrain(p) {
		if py := shebang(p); py != "" && isExecutable(py) && hasTorch(py) {
			return pythonChoice{py, "the interpreter of " + p}, nil
		}
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		return pythonChoice{}, &usageError{msg: "no python3 in PATH, and no PyTorch torchrun to take the interpreter from", hint: "Set PYTHON_EXEC to the Python interpreter that has torch, or put it first in PATH."}
	}
	if !hasTorch(py) {
		return pythonChoice{}, &usageError{msg: fmt.Sprintf("PATH's python3 (%s) cannot import torch", py),
			hint: "Set PYTHON_EXEC to the interpreter that has torch (e.g. PYTHON_EXEC=/usr/bin/python3, or your venv's bin/python), activate its venv, or run gotrain torchrun --no-python python3 … to use this one anyway."}
	}
	return pythonChoice{py, "PATH"}, nil
}

// pythonHasTorch says whether py finds the torch package (without
// importing it: a find_spec takes tens of milliseconds, an import seconds).
func pythonHasTorch(py string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)")
	cmd.Env = append(os.Environ(), "PYTHONSAFEPATH=1") // not the cwd's torch/ directory
	return cmd.Run() == nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// isGotrain says whether p is this very binary (gotrain installed as a
// torchrun symlink), not PyTorch's torchrun script.
func isGotrain(p string) bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	a, err1 := filepath.EvalSymlinks(p)
	b, err2 := filepath.EvalSymlinks(self)
	return err1 == nil && err2 == nil && a == b
}

// shebang is the interpreter a script's #! line names ("" when it names
// none, or runs env: then PATH decides, as for python3).
func shebang(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	if !strings.HasPrefix(line, "#!") {
		return ""
	}
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if len(fields) == 0 || filepath.Base(fields[0]) == "env" || !filepath.IsAbs(fields[0]) {
		return ""
	}
	return fields[0]
}
