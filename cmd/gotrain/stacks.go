package main

import (
	"fmt"
	"strings"
)

// A culprit's goroutine dump (runtime/pprof debug=2, taken by the worker
// library inside the program) opens with the library's own goroutine, and
// each goroutine with the frames of the Go runtime and of gotrain's
// library it waits in. gotrain diagnose prints the program's goroutines
// first, each from its first frame of the program's own code: the frames
// above it are counted in one line. --json keeps the dump as it came.

// libraryPrefixes are the packages of gotrain's worker library and what it
// runs on; the standard library (a path with no dot in its first element)
// counts too.
var libraryPrefixes = []string{
	"github.com/gotrain/gotrain/worker", "github.com/gotrain/gotrain/nccl", "github.com/gotrain/gotrain/internal/",
	"github.com/gotrain/gotrain/proto/", "google.golang.org/grpc", "google.golang.org/protobuf", "golang.org/x/",
}

// stdRoots are the first path elements of the standard library's packages
// (a program's module may be named without a dot too: "train/model").
var stdRoots = map[string]bool{
	"archive": true, "bufio": true, "bytes": true, "cmp": true, "compress": true, "container": true, "context": true,
	"crypto": true, "database": true, "debug": true, "embed": true, "encoding": true, "errors": true, "expvar": true,
	"flag": true, "fmt": true, "go": true, "hash": true, "html": true, "image": true, "internal": true, "io": true,
	"iter": true, "log": true, "maps": true, "math": true, "mime": true, "net": true, "os": true, "path": true,
	"plugin": true, "reflect": true, "regexp": true, "runtime": true, "slices": true, "sort": true, "strconv": true,
	"strings": true, "structs": true, "sync": true, "syscall": true, "testing": true, "text": true, "time": true,
	"unicode": true, "unique": true, "unsafe": true, "weak": true, "vendor": true,
}

// isLibraryFunc says whether fn, a frame's function ("runtime.gopark",
// "github.com/gotrain/gotrain/worker.(*Comm).AllReduce", "main.train"),
// is the runtime's, the standard library's or gotrain's library's.
func isLibraryFunc(fn string) bool {
	for _, p := range libraryPrefixes {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	first, _, slash := strings.Cut(fn, "/")
	if !slash {
		first, _, _ = strings.Cut(fn, ".") // "sync.(*WaitGroup).Wait()": package sync
	}
	return stdRoots[first]
}

// programStacks reorders and trims a goroutine dump as the comment above
// says; text that is no goroutine dump comes back as it is.
func programStacks(text string) string {
	blocks := strings.Split(strings.TrimRight(text, "\n"), "\n\n")
	var program, library []string
	for _, b := range blocks {
		lines := strings.Split(b, "\n")
		if !strings.HasPrefix(lines[0], "goroutine ") {
			return text
		}
		// Frames are a function line and a "\tfile:line" line each.
		skip, ownFrame := 0, false
		for i := 1; i+1 < len(lines) && strings.HasPrefix(lines[i+1], "\t"); i += 2 {
			if strings.HasPrefix(lines[i], "created by ") {
				break
			}
			if !isLibraryFunc(lines[i]) {
				ownFrame = true
				break
			}
			skip++
		}
		switch {
		case !ownFrame:
			library = append(library, b)
		case skip == 0:
			program = append(program, b)
		default:
			kept := append([]string{lines[0], fmt.Sprintf("\t... %d frame(s) of the Go runtime and gotrain's library", skip)}, lines[1+2*skip:]...)
			program = append(program, strings.Join(kept, "\n"))
		}
	}
	return strings.Join(append(program, library...), "\n\n") + "\n"
}
