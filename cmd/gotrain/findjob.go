package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	"github.com/gotrain/gotrain/internal/runfile"
)

// findJob returns the coordinator address, token and how to verify the
// coordinator: the flags', or the job launched on this machine with run id
// runID, the newest when runID is "" (its run file, which says how its
// launcher verified the coordinator).
func findJob(cmd, addr, runID, tok string, trust jobtls.Trust) (string, string, jobtls.Trust, error) {
	if addr != "" && runID != "" {
		return "", "", trust, &usageError{msg: "--run-id and --coordinator together",
			hint: "--run-id picks among the jobs launched on this machine; --coordinator names a job's coordinator itself. Pass one of them."}
	}
	if addr == "" {
		j, others, err := runfile.Find(runID)
		if err != nil {
			switch {
			case errors.Is(err, runfile.ErrNoJob):
				return "", "", trust, &usageError{msg: err.Error(), hint: "For a job launched elsewhere pass --coordinator HOST:PORT and --ca-hash, with the job token in " + jobenv.JobToken + " (never in argv)."}
			case errors.Is(err, runfile.ErrNoSuchRun):
				return "", "", trust, &usageError{msg: err.Error(), hint: "Pass one of the running jobs' run ids (each launcher prints its own), or leave --run-id out for the newest."}
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
		if len(others) > 0 && runID == "" {
			fmt.Fprintf(os.Stderr, "gotrain %s: %d jobs run on this machine; showing the newest, %s (started %s); pass --run-id to pick another: %s\n",
				cmd, len(others)+1, j.RunID, j.Started.Local().Format(time.DateTime), runfile.RunIDs(others))
		}
	}
	if tok == "" {
		return "", "", trust, &usageError{msg: "no job token", hint: "Set " + jobenv.JobToken + " to the job token (the file named on the first node's start line), and pass --coordinator and --ca-hash."}
	}
	// Without --ca-hash or --tls-ca, the proof of the token alone
	// verifies the coordinator (jobtls.Trust).
	return addr, tok, trust, nil
}

// dialJob connects a local tool to the job's coordinator at addrs (one
// HOST:PORT, or a replicated coordinator's replicas, comma-separated):
// calls go to the leader, verified as trust says, with the job token.
func dialJob(addrs, tok string, trust jobtls.Trust) (*leaderconn.Conn, error) {
	creds, err := trust.Credentials(tok, nil) // the proof of the token, both ways
	if err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	var list []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			list = append(list, a)
		}
	}
	lc, err := leaderconn.New(list, func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator address %q: %w", addrs, err)
	}
	return lc, nil
}

// askFailed is a local tool's error for a call to the coordinator at addr
// that failed: a coordinator that failed verification is named as such
// (trying again cannot help); anything else may be a job that ended.
func askFailed(addr string, err error) error {
	m := status.Convert(err).Message()
	for _, p := range []string{"jobtls: ", "tls: failed to verify", "x509: "} {
		if i := strings.Index(m, p); i >= 0 {
			return fmt.Errorf("the coordinator at %s is not the one this tool was told to trust, so the job token was not sent: %s", addr, strings.TrimSuffix(m[i:], `"`))
		}
	}
	return fmt.Errorf("ask the coordinator at %s: %w (is the job still running? is the token right?)", addr, err)
}
