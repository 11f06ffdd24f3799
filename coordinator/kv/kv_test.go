package kv

import (
	"context"
	"errors"
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
