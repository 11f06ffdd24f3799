package agentcore

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

// The agent machine is pure: it takes time as an argument and talks to nothing.
// These tests keep it that way.

// allowedImports are the only packages the machine's own files may import.
var allowedImports = []string{"cmp", "errors", "fmt", "maps", "slices", "sort", "strconv", "strings", "syscall", "time", "github.com/gotrain/gotrain/internal/jobenv"}

// forbiddenTime are the functions of package time that read the clock or wait.
var forbiddenTime = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTimer", "NewTicker"}

func TestImportsArePure(t *testing.T) {
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
			if !slices.Contains(allowedImports, path) {
				t.Errorf("%s imports %q; the agent machine may import only %v", name, path, allowedImports)
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
				t.Errorf("%s: time.%s reads the clock or waits; the machine takes time as Step's argument", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}

func TestDepsArePure(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH; TestImportsArePure still checks direct imports")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "time") {
		t.Fatalf("go list -deps output looks wrong: %v", deps)
	}
	for _, d := range deps {
		for _, bad := range []string{"net", "os/exec", "syscall/js", "google.golang.org/grpc", "google.golang.org/protobuf", "github.com/gotrain/gotrain/proto"} {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("the agent machine depends on %s; it must stay free of network, process and RPC code", d)
			}
		}
	}
}
