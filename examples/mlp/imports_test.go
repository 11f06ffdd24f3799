package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The examples are written as users write programs: they import gotrain's
// public packages (worker, nccl, gpu/...) and never an internal one of the
// library, which a program outside this module cannot import. Every file
// counts, whatever its build tags (the GPU files are tagged cuda).
func TestExamplesImportNoInternalPackage(t *testing.T) {
	const module = "github.com/gotrain/gotrain"
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		n++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			own := strings.HasPrefix(p, module+"/examples/")
			if strings.HasPrefix(p, module+"/") && !own && (strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal")) {
				t.Errorf("%s imports %s: an example may import only gotrain's public packages (make what it needs public, documented)", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("read %d Go files under examples/: the walk did not find them", n)
	}
}
