package nccl

import (
	"errors"
	"strings"
	"testing"
)

var shrinkGrowFuncs = []string{"ncclCommShrink", "ncclCommRevoke", "ncclCommGetUniqueId", "ncclCommGrow"}

// On an NCCL without shrink and grow every call says which release it
// needs, and matches errors.ErrUnsupported, so a caller falls back to a
// new unique id and InitRank.
func TestShrinkGrowMissing(t *testing.T) {
	l := &Library{path: "/usr/lib/libnccl.so.2", version: MakeVersion(2, 26, 2), optional: map[string]bool{}}
	c := &Comm{lib: l}
	c.h.Store(1) // never reached: the symbol check comes first
	calls := map[string]func() error{
		"ncclCommShrink": func() error {
			_, err := c.Shrink(t.Context(), []int{1}, nil, ShrinkAbort)
			return err
		},
		"ncclCommRevoke":      func() error { return c.Revoke(t.Context()) },
		"ncclCommGetUniqueId": func() error { _, err := c.GrowID(); return err },
		"ncclCommGrow": func() error {
			_, err := c.Grow(t.Context(), 4, nil, nil)
			return err
		},
	}
	for _, name := range shrinkGrowFuncs {
		err := calls[name]()
		var me *MissingError
		if !errors.As(err, &me) || !errors.Is(err, errors.ErrUnsupported) || me.Func != name {
			t.Errorf("%s on NCCL 2.26: %v, want a MissingError for it", name, err)
			continue
		}
		if want := Since[name].String() + " or newer"; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", name, err, want)
		}
	}
	if _, err := l.JoinGrow(t.Context(), 4, UniqueID{}, 3, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("JoinGrow on NCCL 2.26: %v, want ErrUnsupported", err)
	}
	if Since["ncclCommShrink"] != MakeVersion(2, 27, 0) || Since["ncclCommGrow"] != MakeVersion(2, 29, 0) {
		t.Errorf("Since: shrink %s, grow %s; want 2.27.0 and 2.29.0", Since["ncclCommShrink"], Since["ncclCommGrow"])
	}
}

// With the functions present, a closed communicator and bad arguments are
// refused before any call into NCCL.
func TestShrinkGrowArguments(t *testing.T) {
	l := &Library{path: "libnccl.so.2", version: MakeVersion(2, 30, 7), optional: map[string]bool{}}
	for _, name := range append(shrinkGrowFuncs, "ncclCommFinalize") {
		l.optional[name] = true
	}
	c := &Comm{lib: l}
	if _, err := c.Shrink(t.Context(), []int{1}, nil, ShrinkAbort); !errors.Is(err, ErrClosed) {
		t.Errorf("Shrink of a closed communicator: %v", err)
	}
	if err := c.Revoke(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Revoke of a closed communicator: %v", err)
	}
	if _, err := c.GrowID(); !errors.Is(err, ErrClosed) {
		t.Errorf("GrowID of a closed communicator: %v", err)
	}
	if _, err := c.Grow(t.Context(), 4, nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Grow of a closed communicator: %v", err)
	}
	if _, err := c.Shrink(t.Context(), []int{1}, nil, ShrinkMode(2)); err == nil || !strings.Contains(err.Error(), "ShrinkDefault or ShrinkAbort") {
		t.Errorf("Shrink with mode 2: %v", err)
	}
	for _, rank := range []int{-1, 4} {
		if _, err := l.JoinGrow(t.Context(), 4, UniqueID{}, rank, nil); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("JoinGrow as rank %d of 4: %v", rank, err)
		}
	}
	// A revoked communicator cannot be finalized (NCCL calls it invalid);
	// the check comes before the call.
	r := &Comm{lib: l}
	r.h.Store(1)
	r.revoked.Store(true)
	if err := r.Finalize(t.Context()); err == nil || !strings.Contains(err.Error(), "after ncclCommRevoke") {
		t.Errorf("Finalize after Revoke: %v", err)
	}
	// Destroy of the parent of an abortive shrink aborts (here: already closed).
	p := &Comm{lib: l}
	p.abortOnly.Store(true)
	if err := p.Destroy(); !errors.Is(err, ErrClosed) {
		t.Errorf("Destroy of a closed abortive-shrink parent: %v", err)
	}
	if ShrinkAbort.String() != "abort" || ShrinkDefault.String() != "default" {
		t.Errorf("ShrinkMode names: %s, %s", ShrinkAbort, ShrinkDefault)
	}
}

func TestCheckExclude(t *testing.T) {
	for _, tc := range []struct {
		exclude []int
		n, self int
		want    string // "" for no error
	}{
		{[]int{3}, 4, 0, ""},
		{[]int{0, 2}, 4, 1, ""},
		{[]int{2, 0}, 4, 3, ""},
		{nil, 4, 0, "at least one rank"},
		{[]int{0, 1, 2, 3}, 4, 0, "at least one must stay"},
		{[]int{4}, 4, 0, "out of range"},
		{[]int{-1}, 4, 0, "out of range"},
		{[]int{1}, 4, 1, "excludes itself"},
		{[]int{2, 2}, 4, 0, "listed twice"},
	} {
		err := checkExclude(tc.exclude, tc.n, tc.self)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("checkExclude(%v, %d, %d) = %v, want nil", tc.exclude, tc.n, tc.self, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("checkExclude(%v, %d, %d) = %v, want %q", tc.exclude, tc.n, tc.self, err, tc.want)
		}
	}
}
