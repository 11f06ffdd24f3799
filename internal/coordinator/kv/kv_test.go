package kv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestPutGet(t *testing.T) {
	s := New()
	if _, ok := s.Get("a"); ok {
		t.Fatal("Get of a missing key found it")
	}
	val := []byte("id-1")
	if err := s.Put("a", val); err != nil {
		t.Fatal(err)
	}
	val[0] = 'X' // the store keeps its own copy
	if err := s.Put("a", []byte("id-1")); err != nil {
		t.Errorf("same value twice: %v, want nil", err)
	}
	if err := s.Put("a", []byte("id-2")); !errors.Is(err, ErrConflict) {
		t.Errorf("another value: %v, want ErrConflict", err)
	}
	got, ok := s.Get("a")
	if !ok || string(got) != "id-1" {
		t.Fatalf("Get = %q, %t; want id-1, true", got, ok)
	}
	got[0] = 'Y' // and hands out copies
	if got, _ := s.Get("a"); string(got) != "id-1" {
		t.Errorf("Get after changing a result = %q, want id-1", got)
	}
}

func TestEmptyValue(t *testing.T) {
	s := New()
	if err := s.Put("e", nil); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Get("e"); !ok || v == nil || len(v) != 0 {
		t.Errorf("Get = %v, %t; want empty non-nil, true", v, ok)
	}
	if err := s.Put("e", []byte{}); err != nil {
		t.Errorf("nil then empty value: %v, want nil (the same value)", err)
	}
}

// Prune drops the keys it is told to and gives their bytes back.
func TestPrune(t *testing.T) {
	s := NewWithLimits(Limits{MaxKeyBytes: 8, MaxValueBytes: 8, MaxKeys: 2, MaxBytes: 1 << 10})
	for _, k := range []string{"old/1", "new/1"} {
		if err := s.Put(k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put("new/2", nil); !errors.Is(err, ErrFull) {
		t.Fatalf("a third key: %v, want ErrFull", err)
	}
	if n := s.Prune(func(k string) bool { return strings.HasPrefix(k, "old/") }); n != 1 {
		t.Errorf("Prune dropped %d keys, want 1", n)
	}
	if _, ok := s.Get("old/1"); ok {
		t.Error("a pruned key is still there")
	}
	if err := s.Put("new/2", nil); err != nil {
		t.Errorf("a key in the room Prune made: %v", err)
	}
	if st := s.Stats(); st.Keys != 2 || st.Bytes != int64(len("new/1")+1+len("new/2")+2*EntryOverhead) {
		t.Errorf("Stats = %+v after Prune", st)
	}
}

// 2000 values of 256 KiB were all kept (670 MB). Keys,
// values and the store's keys and bytes are bounded.
func TestLimits(t *testing.T) {
	s := NewWithLimits(Limits{MaxKeyBytes: 8, MaxValueBytes: 16, MaxKeys: 3, MaxBytes: 3*EntryOverhead + 40})
	if err := s.Put("123456789", nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("9-byte key: %v, want ErrTooLarge", err)
	}
	if err := s.Put("k", make([]byte, 17)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("17-byte value: %v, want ErrTooLarge", err)
	}
	for _, k := range []string{"a", "b"} {
		if err := s.Put(k, make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put("c", make([]byte, 16)); !errors.Is(err, ErrFull) {
		t.Errorf("over MaxBytes: %v, want ErrFull", err)
	}
	if err := s.Put("c", nil); err != nil {
		t.Errorf("a small third key: %v", err)
	}
	if err := s.Put("d", nil); !errors.Is(err, ErrFull) {
		t.Errorf("a fourth key: %v, want ErrFull", err)
	}
	if err := s.Put("a", make([]byte, 16)); err != nil {
		t.Errorf("putting the same value again in a full store: %v", err)
	}

	d := New()
	val := make([]byte, 256<<10)
	var full error
	for i := range 2000 {
		if full = d.Put(fmt.Sprintf("flood-%d", i), val); full != nil {
			break
		}
	}
	if !errors.Is(full, ErrFull) {
		t.Errorf("2000 values of 256 KiB: %v, want ErrFull", full)
	}
	if st := d.Stats(); st.Bytes > DefaultLimits().MaxBytes {
		t.Errorf("store holds %d bytes, over its limit %d", st.Bytes, DefaultLimits().MaxBytes)
	}
}

// Check says what Put would do, and changes nothing.
func TestCheck(t *testing.T) {
	s := NewWithLimits(Limits{MaxKeyBytes: 8, MaxValueBytes: 8, MaxKeys: 2, MaxBytes: 1 << 10})
	if err := s.Put("a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, value string
		held       bool
		err        error
	}{
		{"a", "1", true, nil},
		{"a", "2", false, ErrConflict},
		{"b", "1", false, nil},
		{"long key!", "1", false, ErrTooLarge},
		{"b", "long value", false, ErrTooLarge},
	} {
		held, err := s.Check(c.key, []byte(c.value))
		if held != c.held || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Check(%q, %q) = %t, %v; want %t, %v", c.key, c.value, held, err, c.held, c.err)
		}
	}
	if st := s.Stats(); st.Keys != 1 {
		t.Errorf("Check changed the store: %+v", st)
	}
	if err := s.Put("b", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check("c", []byte("1")); !errors.Is(err, ErrFull) {
		t.Errorf("Check on a full store: %v, want ErrFull", err)
	}
}
