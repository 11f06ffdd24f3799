package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// signalsMode prints every forwarded signal it receives ("got SIGUSR1");
// SIGINT and SIGTERM end it with status 0 after printing. It writes
// DIR/ready-RANK once its handlers are installed.
func signalsMode(args []string) error {
	fs := flag.NewFlagSet("signals", flag.ExitOnError)
	dir := fs.String("pid-dir", "", "directory for the ready file")
	_ = fs.Parse(args)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	ready := filepath.Join(*dir, "ready-"+os.Getenv("GOTRAIN_RANK"))
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		return err
	}
	for s := range sigs {
		name := map[os.Signal]string{syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2", syscall.SIGHUP: "SIGHUP",
			syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM"}[s]
		fmt.Println("got", name)
		if s == syscall.SIGINT || s == syscall.SIGTERM {
			return nil
		}
	}
	return nil
}
