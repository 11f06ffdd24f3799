package supervise_test

import (
	"context"
	"fmt"

	"github.com/gotrain/gotrain/internal/launcher/supervise"
)

func Example() {
	s, err := supervise.New(supervise.Config{}) // no reaper process here
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- s.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	p, err := s.Start(supervise.Spec{
		Path: "/bin/sh",
		Args: []string{"-c", "echo hello; echo oops >&2; exit 3"},
		Output: supervise.LineFunc(func(stream supervise.Stream, line []byte) {
			if stream == supervise.Stdout {
				fmt.Printf("%s: %s\n", stream, line)
			}
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	<-p.Done()
	fmt.Println(p.Exit(), p.Exit().ExitCode())
	// Output:
	// stdout: hello
	// exit status 3 3
}
