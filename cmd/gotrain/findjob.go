package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/runfile"
)

// findJob returns the coordinator address and token to use: the flags', or
// the newest job launched on this machine (its run file).
func findJob(cmd, addr, tok string) (string, string, error) {
	if addr == "" {
		j, others, err := runfile.Newest()
		if err != nil {
			if errors.Is(err, runfile.ErrNoJob) {
				return "", "", &usageError{msg: err.Error(), hint: "Pass --coordinator HOST:PORT and --job-token for a job launched elsewhere."}
			}
			return "", "", err
		}
		addr = j.Coordinator
		if tok == "" || os.Getenv(jobenv.JobToken) == tok {
			tok = j.Token
		}
		if others > 0 {
			fmt.Fprintf(os.Stderr, "gotrain %s: %d other job(s) run on this machine; showing the newest, %s (pass --coordinator for another)\n", cmd, others, j.RunID)
		}
	}
	if tok == "" {
		return "", "", &usageError{msg: "no job token", hint: "Pass --job-token or set " + jobenv.JobToken + "."}
	}
	return addr, tok, nil
}
