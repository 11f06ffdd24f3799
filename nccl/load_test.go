package nccl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSearchNotFoundListsEveryPlace(t *testing.T) {
	dir := t.TempDir()
	bogus := filepath.Join(dir, "libnccl.so.2")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	places := []place{
		{what: "missing file", path: filepath.Join(dir, "nope", "libnccl.so.2")},
		{what: "bogus file", path: bogus},
		{glob: filepath.Join(dir, "python3*", wheelLib)},
	}
	_, err := search(places, filepath.Glob)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("search: got %v, want ErrNotFound", err)
	}
	var nf *NotFoundError
	if !errors.As(err, &nf) || len(nf.Tried) != 3 {
		t.Fatalf("want a NotFoundError with 3 places tried, got %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{"missing file: ", "bogus file: ", filepath.Join(dir, "python3*") + "/nvidia/nccl/lib/libnccl.so.2: no match", "apt-get install libnccl2", LibraryEnv} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if cgoEnabled && !strings.Contains(msg, "nope/libnccl.so.2: cannot open shared object file") {
		t.Errorf("error lacks dlopen's reason for the missing file:\n%s", msg)
	}
}

func TestSearchEnvIsTheOnlyPlace(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{LibraryEnv: dir, "HOME": "/home/x"}
	ps := searchPlaces(func(k string) string { return env[k] })
	if len(ps) != 1 || ps[0].path != filepath.Join(dir, soname) || !ps[0].env {
		t.Fatalf("with %s set to a directory, places = %+v", LibraryEnv, ps)
	}
	_, err := search(ps, filepath.Glob)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "Fix "+LibraryEnv) {
		t.Fatalf("a bad %s should say to fix it, got: %v", LibraryEnv, err)
	}
}

func TestSearchPlacesDefault(t *testing.T) {
	env := map[string]string{"HOME": "/home/u", "VIRTUAL_ENV": "/venv", "CONDA_PREFIX": "/conda"}
	ps := searchPlaces(func(k string) string { return env[k] })
	var got []string
	for _, p := range ps {
		got = append(got, p.path+p.glob)
	}
	all := strings.Join(got, "\n")
	if got[0] != soname {
		t.Errorf("first place is %q, want the loader's %q", got[0], soname)
	}
	for _, want := range []string{
		"/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
		"/conda/lib/libnccl.so.2",
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
		"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
		"/home/u/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("places lack %s:\n%s", want, all)
		}
	}
}

// TestLoad passes on machines with and without NCCL: it checks that Load
// either works or says what to do.
func TestLoad(t *testing.T) {
	lib, err := Load()
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Load: %v (want ErrNotFound when there is no NCCL)", err)
		}
		if !strings.Contains(err.Error(), LibraryEnv) {
			t.Errorf("Load's error should name %s:\n%v", LibraryEnv, err)
		}
		t.Logf("no NCCL here, as Load says:\n%v", err)
		return
	}
	t.Logf("NCCL %s from %s", lib.Version(), lib.Path())
	if lib.Version() < MinVersion {
		t.Errorf("loaded NCCL %s is older than %s", lib.Version(), MinVersion)
	}
	if again, _ := Load(); again != lib {
		t.Error("a second Load returned another Library")
	}
	for name, since := range Since {
		if lib.Version() >= since && !lib.Has(name) {
			t.Errorf("NCCL %s lacks %s, which %s added", lib.Version(), name, since)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		v          Version
		a, b, c    int
		s          string
		makeAgrees bool
	}{
		{22803, 2, 28, 3, "2.28.3", true},
		{2708, 2, 7, 8, "2.7.8", true},
		{21400, 2, 14, 0, "2.14.0", true},
		{30001, 3, 0, 1, "3.0.1", true},
	} {
		a, b, c := tc.v.Parts()
		if a != tc.a || b != tc.b || c != tc.c || tc.v.String() != tc.s {
			t.Errorf("%d: got %d.%d.%d %q", int(tc.v), a, b, c, tc.v)
		}
		if MakeVersion(tc.a, tc.b, tc.c) != tc.v {
			t.Errorf("MakeVersion(%d,%d,%d) = %d, want %d", tc.a, tc.b, tc.c, MakeVersion(tc.a, tc.b, tc.c), tc.v)
		}
	}
	if !(MakeVersion(2, 8, 4) < MakeVersion(2, 9, 6)) {
		t.Error("2.8.4 should order before 2.9.6 across the encoding change")
	}
}

func TestMissingError(t *testing.T) {
	l := &Library{path: "/usr/lib/libnccl.so.2", version: MakeVersion(2, 17, 1), optional: map[string]bool{"ncclCommFinalize": true}}
	if err := l.need("ncclCommFinalize"); err != nil {
		t.Fatalf("need(present) = %v", err)
	}
	err := l.need("ncclCommSplit")
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("need(missing) = %v, want ErrUnsupported", err)
	}
	want := "nccl: ncclCommSplit needs NCCL 2.18.0 or newer, but /usr/lib/libnccl.so.2 is NCCL 2.17.1"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %q, want prefix %q", err, want)
	}
	c := &Comm{lib: l}
	if _, err := c.Split(t.Context(), 0, 0, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Split on an NCCL without it: %v", err)
	}
	if _, err := l.InitRankScalable(t.Context(), 2, 0, make([]UniqueID, 1), nil); !strings.Contains(fmtErr(err), "2.23.0") {
		t.Errorf("InitRankScalable on 2.17: %v", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestErrorMatchesResult(t *testing.T) {
	err := error(&Error{Op: "ncclAllReduce", Result: InvalidArgument, Message: "invalid argument (run with NCCL_DEBUG=WARN for details)", Detail: "AllReduce: invalid type 99"})
	if !errors.Is(err, InvalidArgument) || errors.Is(err, InProgress) {
		t.Error("errors.Is should match the Result only")
	}
	want := "nccl: ncclAllReduce: invalid argument (run with NCCL_DEBUG=WARN for details) (ncclInvalidArgument): AllReduce: invalid type 99"
	if err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
}

func TestDataTypes(t *testing.T) {
	sizes := map[DataType]int{Int8: 1, Uint8: 1, Int32: 4, Uint32: 4, Int64: 8, Uint64: 8, Float16: 2, Float32: 4, Float64: 8, BFloat16: 2, Float8E4M3: 1, Float8E5M2: 1}
	if len(sizes) != 12 {
		t.Fatal("table should cover ncclNumTypes = 12")
	}
	for dt, n := range sizes {
		if dt.Size() != n || strings.HasPrefix(dt.String(), "DataType(") {
			t.Errorf("%d: size %d name %s", int32(dt), dt.Size(), dt)
		}
	}
	if DataType(12).Size() != 0 || RedOp(5).String() != "RedOp(5)" {
		t.Error("unknown values should say so")
	}
}

func TestUniqueIDFromBytes(t *testing.T) {
	b := make([]byte, 128)
	b[0], b[127] = 1, 2
	id, err := UniqueIDFromBytes(b)
	if err != nil || id[0] != 1 || id[127] != 2 {
		t.Fatalf("got %v, %v", id[:2], err)
	}
	if _, err := UniqueIDFromBytes(b[:64]); err == nil {
		t.Error("a 64-byte id should fail")
	}
}

// AbortAsync of a communicator already closed answers ErrClosed at once.
func TestAbortAsyncClosed(t *testing.T) {
	var c Comm
	if err := <-c.AbortAsync(); !errors.Is(err, ErrClosed) {
		t.Errorf("AbortAsync of a closed communicator: %v, want ErrClosed", err)
	}
}
