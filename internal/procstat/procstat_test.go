package procstat

import (
	"os"
	"slices"
	"strconv"
	"testing"
)

func TestParseTakesTheCommandNameAsItComes(t *testing.T) {
	got := Parse("42 (a) b (c)) S 1 42 42 0")
	if want := []string{"S", "1", "42", "42", "0"}; !slices.Equal(got, want) {
		t.Errorf("Parse = %q, want %q", got, want)
	}
	if Parse("garbage") != nil {
		t.Error("Parse of text without ')' is not nil")
	}
}

func TestFieldsOfThisProcess(t *testing.T) {
	f := Fields(os.Getpid())
	if len(f) < 2 || f[1] != strconv.Itoa(os.Getppid()) {
		t.Errorf("Fields(self) = %q; want ppid %d second", f, os.Getppid())
	}
	if Fields(0) != nil {
		t.Error("Fields(0) is not nil")
	}
}
