package worker

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"
)

// go doc shows the package documentation's sections: a comment that is
// not attached to the package clause is dropped by go doc without a word.
func TestPackageDocSections(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	p := pkgs["worker"]
	if p == nil {
		t.Fatal("no package worker here")
	}
	var files []*ast.File
	for _, f := range p.Files {
		files = append(files, f)
	}
	d, err := doc.NewFromFiles(fset, files, "github.com/gotrain/gotrain/worker")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Usage", "# Data parallel", "DataParallel averages gradients over the ranks", "# Errors"} {
		if !strings.Contains(d.Doc, want) {
			t.Errorf("the package doc lacks %q", want)
		}
	}
}
