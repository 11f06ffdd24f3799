package worker

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// go doc shows the package documentation's sections: a comment that is
// not attached to the package clause is dropped by go doc without a word.
func TestPackageDocSections(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	d, err := doc.NewFromFiles(fset, files, "github.com/gotrain/gotrain/worker")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Usage", "# Restoring and recovering", "Restore is the one restore", "# Data parallel", "DataParallel averages gradients over the ranks", "# Errors"} {
		if !strings.Contains(d.Doc, want) {
			t.Errorf("the package doc lacks %q", want)
		}
	}
}
