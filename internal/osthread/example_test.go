package osthread_test

import (
	"fmt"

	"github.com/gotrain/gotrain/internal/osthread"
)

func Example() {
	// setup and teardown run on the locked thread, as every Do does: the
	// place to make a CUDA context current and to release it.
	e, err := osthread.Start(func() error { fmt.Println("setup"); return nil }, func() { fmt.Println("teardown") })
	if err != nil {
		fmt.Println(err)
		return
	}
	err = e.Do(func() error {
		fmt.Println("work on the locked thread")
		return nil
	})
	fmt.Println("Do:", err)
	e.Stop()
	fmt.Println("after Stop:", e.Do(func() error { return nil }))
	// Output:
	// setup
	// work on the locked thread
	// Do: <nil>
	// teardown
	// after Stop: osthread: the thread has stopped
}
