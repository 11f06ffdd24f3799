// Command snapserve serves an in-memory snapshot store on a snapshot
// socket, as a node's agent does, for the Python package's tests
// (python/tests): they run the package against the real server rather
// than an imitation of its protocol.
//
//	snapserve -socket DIR/snapshot.sock -token TOKEN [-limit BYTES]
//
// It prints "ready" on stdout once the socket accepts connections and
// serves until stdin closes or it is signalled, so a test that dies
// leaves no server behind.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gotrain/gotrain/internal/memsnap"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "snapserve:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("snapserve", flag.ContinueOnError)
	sock := fs.String("socket", "", "path of the snapshot socket to serve (required)")
	token := fs.String("token", "", "job token every hello must carry (required)")
	limit := fs.Int64("limit", 0, "bytes the store keeps at most (0: no bound)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: snapserve -socket DIR/snapshot.sock -token TOKEN [-limit BYTES]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sock == "" || *token == "" {
		fs.Usage()
		return fmt.Errorf("-socket and -token are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The test holds stdin open: its end (the test gone) ends the server.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	st := memsnap.NewStore(*limit)
	defer st.Close()
	lis, err := memsnap.Listen(*sock)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	srv := &memsnap.Server{Store: st, Token: *token}
	return srv.Serve(ctx, lis)
}
