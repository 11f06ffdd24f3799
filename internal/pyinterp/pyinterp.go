// Package pyinterp chooses the Python interpreter gotrain runs a Python
// program with. `gotrain launch -- script.py` and `gotrain torchrun
// script.py` use this one rule, so the same script runs with the same
// interpreter under both commands.
//
// The rule, first match wins:
//
//  1. $PYTHON_EXEC (as torchrun's own does);
//  2. the venv of the torchrun symlink gotrain was started as (a python3 or
//     python beside it in the venv's bin directory);
//  3. when the program needs torch (torchrun always: it is torch's launcher;
//     launch when the script imports torch): the interpreter of PyTorch's
//     own torchrun script on PATH (its #! line) if it finds torch, then
//     PATH's python3 if it finds torch, else an error saying how to pick
//     one, instead of every rank failing at `import torch`;
//  4. PATH's python3.
//
// The caller prints the choice and its reason once.
package pyinterp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Choice is the chosen interpreter and why it was chosen.
type Choice struct {
	Path string // absolute path of the interpreter
	Why  string // e.g. "$PYTHON_EXEC", "PATH", "the interpreter of /usr/bin/torchrun"
}

// Error is a choice that cannot be made, with what to do about it.
type Error struct{ Msg, Hint string }

func (e *Error) Error() string { return e.Msg + "\n" + e.Hint }

// Env is what the rule looks at, passed in so that a test can decide it.
type Env struct {
	Getenv   func(string) string
	Self     string                       // how gotrain was started (os.Args[0])
	LookPath func(string) (string, error) // exec.LookPath
	HasTorch func(python string) bool     // HasTorch
	IsSelf   func(path string) bool       // path is this very binary (IsSelf)
	Escape   string                       // how to run PATH's python3 anyway, for the hint
}

// System is the Env of this process; escape is the command-line way to use
// PATH's python3 without the torch check (it differs by command).
func System(escape string) Env {
	return Env{Getenv: os.Getenv, Self: os.Args[0], LookPath: exec.LookPath, HasTorch: HasTorch, IsSelf: IsSelf, Escape: escape}
}

// Choose picks the interpreter. needsTorch says the program imports torch.
func Choose(env Env, needsTorch bool) (Choice, error) {
	if p := env.Getenv("PYTHON_EXEC"); p != "" {
		full, err := env.LookPath(p)
		if err != nil {
			return Choice{}, &Error{Msg: fmt.Sprintf("PYTHON_EXEC=%s: %v", p, err),
				Hint: "Set PYTHON_EXEC to the Python interpreter that has torch (a path, or a command on PATH), or unset it."}
		}
		if abs, err := filepath.Abs(full); err == nil {
			full = abs
		}
		return Choice{full, "$PYTHON_EXEC"}, nil
	}
	if filepath.Base(env.Self) == "torchrun" {
		link := env.Self
		if !strings.Contains(link, "/") {
			if p, err := env.LookPath(link); err == nil {
				link = p
			}
		}
		dir := filepath.Dir(link)
		if _, err := os.Stat(filepath.Join(dir, "..", "pyvenv.cfg")); err == nil {
			for _, n := range []string{"python3", "python"} {
				if p := filepath.Join(dir, n); isExecutable(p) {
					return Choice{p, "the venv of " + link}, nil
				}
			}
		}
	}
	if needsTorch {
		if p, err := env.LookPath("torchrun"); err == nil && !env.IsSelf(p) {
			if py := Shebang(p); py != "" && isExecutable(py) && env.HasTorch(py) {
				return Choice{py, "the interpreter of " + p + ", which has torch"}, nil
			}
		}
	}
	py, err := env.LookPath("python3")
	if err != nil {
		return Choice{}, &Error{Msg: "no python3 in PATH, and no PyTorch torchrun to take the interpreter from",
			Hint: "Set PYTHON_EXEC to the Python interpreter to run (the one that has torch), or put it first in PATH."}
	}
	if abs, err := filepath.Abs(py); err == nil {
		py = abs
	}
	if !needsTorch {
		return Choice{py, "PATH"}, nil
	}
	if !env.HasTorch(py) {
		hint := "Set PYTHON_EXEC to the interpreter that has torch (e.g. PYTHON_EXEC=/usr/bin/python3, or your venv's bin/python), or activate its venv"
		if env.Escape != "" {
			hint += ", or run " + env.Escape + " to use this one anyway"
		}
		return Choice{}, &Error{Msg: fmt.Sprintf("PATH's python3 (%s) cannot import torch", py), Hint: hint + "."}
	}
	return Choice{py, "PATH, which has torch"}, nil
}

// HasTorch says whether python finds the torch package (without importing
// it: a find_spec takes tens of milliseconds, an import seconds).
func HasTorch(python string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)")
	cmd.Env = append(os.Environ(), "PYTHONSAFEPATH=1") // not the cwd's torch/ directory
	return cmd.Run() == nil
}

// importsTorch matches a line that imports torch or one of its modules:
// `import torch`, `import torch.distributed as dist`, `import os, torch`,
// `from torch import nn`, `from torch.nn import functional`.
var importsTorch = regexp.MustCompile(`(?m)^[ \t]*(?:from[ \t]+torch(?:\.[\w.]+)?[ \t]+import\b|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*torch\b)`)

// ImportsTorch says whether the script at path imports torch at the start
// of a line (its first MiB is read; an unreadable script does not).
func ImportsTorch(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return importsTorch.Match(b)
}

// IsSelf says whether p is this very binary (gotrain installed as a
// torchrun symlink), not PyTorch's torchrun script.
func IsSelf(p string) bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	a, err1 := filepath.EvalSymlinks(p)
	b, err2 := filepath.EvalSymlinks(self)
	return err1 == nil && err2 == nil && a == b
}

// Shebang is the interpreter a script's #! line names ("" when it names
// none, or runs env: then PATH decides, as for python3).
func Shebang(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, _ := bufio.NewReader(io.LimitReader(f, 4096)).ReadString('\n')
	if !strings.HasPrefix(line, "#!") {
		return ""
	}
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if len(fields) == 0 || filepath.Base(fields[0]) == "env" || !filepath.IsAbs(fields[0]) {
		return ""
	}
	return fields[0]
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
