package kv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
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

func TestWaitBeforePut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		done := make(chan []byte)
		go func() {
			v, err := s.Wait(t.Context(), "k")
			if err != nil {
				t.Error(err)
			}
			done <- v
		}()
		synctest.Wait() // the waiter is blocked
		select {
		case v := <-done:
			t.Fatalf("Wait returned %q before Put", v)
		default:
		}
		if err := s.Put("k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if v := <-done; string(v) != "v" {
			t.Errorf("Wait = %q, want v", v)
		}
	})
}

func TestWaitAfterPut(t *testing.T) {
	s := New()
	if err := s.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	v, err := s.Wait(t.Context(), "k")
	if err != nil || string(v) != "v" {
		t.Errorf("Wait = %q, %v; want v, nil", v, err)
	}
}

func TestWaitTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := s.Wait(ctx, "never")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait = %v, want DeadlineExceeded", err)
		}
		// A later put still wakes later waiters.
		if err := s.Put("never", []byte("now")); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Wait(t.Context(), "never"); err != nil || string(v) != "now" {
			t.Errorf("Wait after put = %q, %v", v, err)
		}
	})
}

// A lookup of a missing key used to leave its ready channel
// in the store for good (~191 B each). Watch's release removes it; a Put
// after the reader gave up finds no one to wake and still works.
func TestMissingKeyLookupLeavesNothing(t *testing.T) {
	s := New()
	for i := range 1000 {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := s.Wait(ctx, fmt.Sprintf("missing-%d", i)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v", err)
		}
	}
	if st := s.Stats(); st != (Stats{}) {
		t.Errorf("after 1000 lookups of missing keys the store holds %+v, want nothing", st)
	}
	// Two readers of one key: the first release keeps the entry for the second.
	r1, rel1 := s.Watch("k")
	r2, rel2 := s.Watch("k")
	rel1()
	rel1() // release is idempotent
	if err := s.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []<-chan struct{}{r1, r2} {
		select {
		case <-r:
		default:
			t.Error("Put did not wake a reader")
		}
	}
	rel2()
	if st := s.Stats(); st.Waiting != 0 || st.Keys != 1 {
		t.Errorf("Stats = %+v, want 1 key, none waiting", st)
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
