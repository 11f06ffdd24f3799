package kvwait

import (
	"fmt"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPutWakesWatchers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := New()
		ready, release := w.Watch("k")
		defer release()
		woke := make(chan struct{})
		go func() {
			<-ready
			close(woke)
		}()
		synctest.Wait() // the reader is blocked
		select {
		case <-woke:
			t.Fatal("the reader woke before Put")
		default:
		}
		w.Put("other")
		synctest.Wait()
		select {
		case <-woke:
			t.Fatal("Put of another key woke the reader")
		default:
		}
		w.Put("k")
		<-woke
	})
}

// A lookup of a missing key used to leave its ready channel behind for
// good (~191 B each). Release removes it; a Put after the reader gave up
// finds no one to wake.
func TestReleaseLeavesNothing(t *testing.T) {
	w := New()
	for i := range 1000 {
		_, release := w.Watch(fmt.Sprintf("missing-%d", i))
		release()
	}
	if n := w.Len(); n != 0 {
		t.Errorf("after 1000 released lookups %d keys are watched, want none", n)
	}
	// Two readers of one key: the first release keeps the entry for the second.
	r1, rel1 := w.Watch("k")
	r2, rel2 := w.Watch("k")
	rel1()
	rel1() // release is idempotent
	w.Put("k")
	for _, r := range []<-chan struct{}{r1, r2} {
		select {
		case <-r:
		default:
			t.Error("Put did not wake a reader")
		}
	}
	rel2()
	if n := w.Len(); n != 0 {
		t.Errorf("%d keys watched after Put and release, want none", n)
	}
}

// PutAll wakes the readers of the keys that have a value, and only those.
func TestPutAll(t *testing.T) {
	w := New()
	a, relA := w.Watch("a")
	b, relB := w.Watch("b")
	defer relA()
	defer relB()
	w.PutAll(func(k string) bool { return k == "a" })
	select {
	case <-a:
	default:
		t.Error("PutAll did not wake the reader of a key with a value")
	}
	select {
	case <-b:
		t.Error("PutAll woke the reader of a key without a value")
	default:
	}
	if n := w.Len(); n != 1 {
		t.Errorf("%d keys watched, want 1", n)
	}
}
