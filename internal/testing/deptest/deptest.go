// Package deptest keeps a pure state machine pure: tests of such a package
// (internal/coordinator/job, internal/launcher/agentcore) call Check, which fails when one of
// its files imports a package it may not, reads the clock or waits, or when
// anything it depends on, directly or not, is network, process or RPC code.
package deptest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// forbiddenTime are the functions of package time that read the clock or wait.
var forbiddenTime = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTimer", "NewTicker"}

// forbiddenDeps are what a pure machine may not depend on at all.
var forbiddenDeps = []string{"net", "os/exec", "syscall/js", "google.golang.org/grpc", "google.golang.org/protobuf", "github.com/gotrain/gotrain/proto"}

// Check checks the package in the test's working directory: its non-test
// files import only allowed, use no clock or timer of package time, and
// `go list -deps` finds none of forbiddenDeps (skipped without a go tool).
// what names the machine in the messages ("the job machine").
func Check(t *testing.T, what string, allowed []string) {
	t.Helper()
	t.Run("imports", func(t *testing.T) { checkImports(t, what, allowed) })
	t.Run("deps", func(t *testing.T) { checkDeps(t, what) })
}

func checkImports(t *testing.T, what string, allowed []string) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		timeName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(allowed, path) {
				t.Errorf("%s imports %q; %s may import only %v", name, path, what, allowed)
			}
			if path == "time" {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && slices.Contains(forbiddenTime, sel.Sel.Name) {
				t.Errorf("%s: time.%s reads the clock or waits; %s takes time as Step's argument", fset.Position(sel.Pos()), sel.Sel.Name, what)
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}

func checkDeps(t *testing.T, what string) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH; the imports check still covers direct imports")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "runtime") {
		t.Fatalf("go list -deps output looks wrong: %v", deps)
	}
	for _, d := range deps {
		for _, bad := range forbiddenDeps {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("%s depends on %s; it must stay free of network, process and RPC code", what, d)
			}
		}
	}
}
