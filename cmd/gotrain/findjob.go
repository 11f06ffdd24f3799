package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/runfile"
)

// findJob returns the coordinator address, token and how to verify the
// coordinator: the flags', or the newest job launched on this machine (its
// run file, which says how its launcher verified the coordinator).
func findJob(cmd, addr, tok string, trust jobtls.Trust) (string, string, jobtls.Trust, error) {
	if addr == "" {
		j, others, err := runfile.Newest()
		if err != nil {
			if errors.Is(err, runfile.ErrNoJob) {
				return "", "", trust, &usageError{msg: err.Error(), hint: "Pass --coordinator HOST:PORT and --job-token for a job launched elsewhere."}
			}
			return "", "", trust, err
		}
		addr = j.Coordinator
		if trust == (jobtls.Trust{}) {
			trust = j.Trust
		}
		if tok == "" || os.Getenv(jobenv.JobToken) == tok {
			tok = j.Token
		}
		if others > 0 {
			fmt.Fprintf(os.Stderr, "gotrain %s: %d other job(s) run on this machine; showing the newest, %s (pass --coordinator for another)\n", cmd, others, j.RunID)
		}
	}
	if tok == "" {
		return "", "", trust, &usageError{msg: "no job token", hint: "Pass --job-token or set " + jobenv.JobToken + "."}
	}
	if trust == (jobtls.Trust{}) {
		return "", "", trust, &usageError{msg: "no way to verify the coordinator before sending it the job token",
			hint: "Pass --ca-hash sha256:... as the first node printed it, or --tls-ca FILE for your site's PKI (--insecure-skip-ca-check sends the token unverified)."}
	}
	return addr, tok, trust, nil
}
