package commtest

import (
	"context"
	"errors"
	"testing"
)

func TestMemStoreGetWaitsForPut(t *testing.T) {
	s := NewMemStore()
	got := make(chan []byte, 1)
	go func() {
		v, err := s.Get(t.Context(), "k")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	if err := s.Put(t.Context(), "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "v1" {
		t.Fatalf("Get = %q, want v1", v)
	}
	if err := s.Put(t.Context(), "k", []byte("v1")); err != nil {
		t.Fatalf("same value again: %v", err)
	}
	if err := s.Put(t.Context(), "k", []byte("v2")); err == nil {
		t.Fatal("Put of a different value succeeded")
	}
	if s.Keys() != 1 {
		t.Fatalf("Keys = %d, want 1", s.Keys())
	}
}

func TestMemStoreGetHonoursContext(t *testing.T) {
	s := NewMemStore()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get = %v, want context.Canceled", err)
	}
}
