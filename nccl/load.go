package nccl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// LibraryEnv names the environment variable that points Load at a
// libnccl.so.2 (a file, or a directory holding one).
const LibraryEnv = "GOTRAIN_NCCL_LIBRARY"

const soname = "libnccl.so.2"

// MinVersion is the oldest NCCL that Load accepts: the first with ncclSend
// and ncclRecv.
var MinVersion = MakeVersion(2, 7, 0)

// ErrNotFound matches the error of Load when no usable libnccl.so.2 was found.
var ErrNotFound = errors.New("nccl: libnccl.so.2 not found")

// Library is the loaded NCCL. A process loads one NCCL, once; every Comm
// calls into it.
type Library struct {
	path     string
	version  Version
	optional map[string]bool
}

// Path returns the file or soname Load opened.
func (l *Library) Path() string { return l.path }

// Version returns ncclGetVersion's answer.
func (l *Library) Version() Version { return l.version }

// Has reports whether the loaded NCCL exports the optional function name
// (such as "ncclCommSplit").
func (l *Library) Has(name string) bool { return l.optional[name] }

var (
	loadMu sync.Mutex
	loaded *Library
)

// Load finds and opens NCCL, or returns the Library it opened before. It
// tries, in order: the file (or directory) in $GOTRAIN_NCCL_LIBRARY, and
// nothing else when that is set; libnccl.so.2 through the dynamic loader
// (LD_LIBRARY_PATH, ld.so.cache: where the libnccl2 package puts it); and
// NCCL inside Python's nvidia-nccl wheels (virtualenvs, conda, /opt/*/.venv,
// /usr/local/lib/python3*, ~/.local). A failure is not remembered: a later
// Load searches again. The error of a failed search matches ErrNotFound and
// lists every place it looked.
func Load() (*Library, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	l, err := search(searchPlaces(os.Getenv), filepath.Glob)
	if err != nil {
		return nil, err
	}
	loaded = l
	return l, nil
}

// place is one place Load looks: a path or soname, or a glob pattern.
type place struct {
	what string // how the error names it
	path string // a file or soname to dlopen; "" when pattern is set
	glob string
	env  bool // from $GOTRAIN_NCCL_LIBRARY: when it fails, stop
}

var wheelDirs = []string{
	"/opt/*/.venv/lib/python3*/site-packages",
	"/opt/*/venv/lib/python3*/site-packages",
	"/opt/conda/lib/python3*/site-packages",
	"/usr/local/lib/python3*/dist-packages",
	"/usr/local/lib/python3*/site-packages",
	"/usr/lib/python3/dist-packages",
}

const wheelLib = "nvidia/nccl/lib/" + soname

// searchPlaces returns where Load looks, in order.
func searchPlaces(getenv func(string) string) []place {
	if p := getenv(LibraryEnv); p != "" {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			p = filepath.Join(p, soname)
		}
		return []place{{what: "$" + LibraryEnv + " = " + p, path: p, env: true}}
	}
	ps := []place{{what: "the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache, /usr/lib)", path: soname}}
	var dirs []string
	if v := getenv("VIRTUAL_ENV"); v != "" {
		dirs = append(dirs, v+"/lib/python3*/site-packages")
	}
	if v := getenv("CONDA_PREFIX"); v != "" {
		ps = append(ps, place{what: v + "/lib/" + soname, path: v + "/lib/" + soname})
		dirs = append(dirs, v+"/lib/python3*/site-packages")
	}
	dirs = append(dirs, wheelDirs...)
	if h := getenv("HOME"); h != "" {
		dirs = append(dirs, h+"/.local/lib/python3*/site-packages")
	}
	for _, d := range dirs {
		ps = append(ps, place{glob: d + "/" + wheelLib})
	}
	return ps
}

// NotFoundError is Load's error when no usable NCCL was found.
type NotFoundError struct {
	Tried []string // each place and why it failed
	Env   bool     // $GOTRAIN_NCCL_LIBRARY was set
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	b.WriteString("nccl: no usable " + soname + " found; looked in:\n")
	for _, t := range e.Tried {
		b.WriteString("  - " + t + "\n")
	}
	if e.Env {
		b.WriteString("Fix " + LibraryEnv + " to name libnccl.so.2 (or its directory), or unset it to search the usual places.")
	} else {
		b.WriteString("Install NCCL (Debian/Ubuntu: apt-get install libnccl2; or pip install nvidia-nccl-cu12), " +
			"or set " + LibraryEnv + " to the path of libnccl.so.2.")
	}
	return b.String()
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// search opens the first place that holds a usable NCCL.
func search(places []place, glob func(string) ([]string, error)) (*Library, error) {
	nf := &NotFoundError{}
	try := func(what, path string) *Library {
		if msg := cOpen(path); msg != "" {
			nf.Tried = append(nf.Tried, what+": "+msg)
			return nil
		}
		l, err := newLibrary(path)
		if err != nil {
			cClose()
			nf.Tried = append(nf.Tried, what+": "+err.Error())
			return nil
		}
		return l
	}
	for _, p := range places {
		nf.Env = nf.Env || p.env
		if p.glob == "" {
			if l := try(p.what, p.path); l != nil {
				return l, nil
			}
			continue
		}
		matches, _ := glob(p.glob)
		if len(matches) == 0 {
			nf.Tried = append(nf.Tried, p.glob+": no match")
			continue
		}
		sort.Sort(sort.Reverse(sort.StringSlice(matches))) // newest python3.N first
		for _, m := range matches {
			if l := try(m, m); l != nil {
				return l, nil
			}
		}
	}
	return nil, nf
}

// Since lists the optional NCCL functions and the release that added each.
var Since = map[string]Version{
	"ncclGetLastError":         MakeVersion(2, 13, 0),
	"ncclCommInitRankConfig":   MakeVersion(2, 14, 0),
	"ncclCommFinalize":         MakeVersion(2, 14, 0),
	"ncclCommSplit":            MakeVersion(2, 18, 0),
	"ncclCommInitRankScalable": MakeVersion(2, 23, 0),
	"ncclMemAlloc":             MakeVersion(2, 19, 0),
	"ncclMemFree":              MakeVersion(2, 19, 0),
	"ncclCommWindowRegister":   MakeVersion(2, 27, 0),
	"ncclCommWindowDeregister": MakeVersion(2, 27, 0),
	"ncclCommShrink":           MakeVersion(2, 27, 0),
	"ncclCommRevoke":           MakeVersion(2, 29, 0),
	"ncclCommGetUniqueId":      MakeVersion(2, 29, 0),
	"ncclCommGrow":             MakeVersion(2, 29, 0),
}

// newLibrary describes the NCCL that cOpen just opened.
func newLibrary(path string) (*Library, error) {
	v, r := cGetVersion()
	if r != Success {
		return nil, newError("ncclGetVersion", r, 0)
	}
	l := &Library{path: path, version: Version(v), optional: map[string]bool{}}
	if l.version < MinVersion {
		return nil, fmt.Errorf("NCCL %s is too old: gotrain needs %s or newer", l.version, MinVersion)
	}
	for i := 0; ; i++ {
		name := cOptionalName(i)
		if name == "" {
			break
		}
		l.optional[name] = cOptionalPresent(i)
	}
	return l, nil
}

// MissingError is the error of a call whose NCCL function the loaded
// library lacks. It matches errors.ErrUnsupported.
type MissingError struct {
	Func  string  // e.g. "ncclCommSplit"
	Since Version // the release that added it
	Have  Version // the loaded library's version
	Path  string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("nccl: %s needs NCCL %s or newer, but %s is NCCL %s; install a newer NCCL or point %s at one",
		e.Func, e.Since, e.Path, e.Have, LibraryEnv)
}

func (e *MissingError) Is(target error) bool { return target == errors.ErrUnsupported }

func (l *Library) need(name string) error {
	if l.optional[name] {
		return nil
	}
	return &MissingError{Func: name, Since: Since[name], Have: l.version, Path: l.path}
}
