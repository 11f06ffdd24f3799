package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// plainMode is a program that does not use gotrain's worker library: it
// reads its rank from the environment. In the first attempt rank --victim
// exits 1 once --go exists and the others wait to be stopped; later
// attempts print and exit 0. Without a rank (a standby) it just waits, like
// any program that knows nothing of standbys.
func plainMode(args []string) error {
	fs := flag.NewFlagSet("plain", flag.ExitOnError)
	victim := fs.String("victim", "1", "rank that exits 1 in the first attempt")
	goFile := fs.String("go", "", "the victim exits once this file exists")
	_ = fs.Parse(args)
	rank, restarts := os.Getenv("GOTRAIN_RANK"), os.Getenv("GOTRAIN_RESTART_COUNT")
	if rank == "" {
		time.Sleep(time.Hour)
		return nil
	}
	fmt.Printf("plain rank=%s restart=%s pid=%d\n", rank, restarts, os.Getpid())
	if restarts != "0" {
		return nil
	}
	if rank != *victim {
		time.Sleep(time.Hour) // stopped by the agent
		return nil
	}
	for {
		if _, err := os.Stat(*goFile); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "rank %s exits on purpose\n", rank)
	os.Exit(1)
	return nil
}
