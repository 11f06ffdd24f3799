package host

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The job CA of a standalone replica set (`gotrain coordinator --peers
// A,B,C`): random, made by the first of --peers, handed to the others
// (ReplicaCA, package coordinator's replicakeys.go) over a connection on
// which both sides proved the job token, to a caller from a listed peer's
// host. A replica that starts (or restarts) asks the others first: the
// first peer makes a new CA only when none answers, the others wait for
// one that does.

// peerCAWait bounds how long a replica other than the first waits for a
// peer to hand it the job CA.
var peerCAWait = 2 * time.Minute

// peerCA is the job CA of a standalone replica set, for the replica at
// c.Listen.
func (c Config) peerCA(ctx context.Context) (*jobtls.CA, error) {
	first := c.Peers[0] == c.Listen
	var others []string
	for _, p := range c.Peers {
		if p != c.Listen {
			others = append(others, p)
		}
	}
	deadline := time.Now().Add(peerCAWait)
	said := time.Now()
	for {
		ca, errs := askPeers(ctx, others, c.JobToken)
		if ca != nil {
			c.Logger.Info("the job CA came from a peer replica", "ca_hash", ca.Hash())
			return ca, nil
		}
		if first {
			c.Logger.Info("no peer replica holds the job CA yet: this one, the first of --peers, makes it", "peers", c.Peers)
			return jobtls.NewCA(c.RunID)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, &ConfigError{Msg: fmt.Sprintf("no replica of --peers %v handed this one the job CA within %s (%v)", c.Peers, peerCAWait, errs),
				Hint: fmt.Sprintf("Start the first of --peers (%s) too: it makes the job's CA, which the others take from it.", c.Peers[0])}
		}
		if time.Since(said) > 10*time.Second {
			said = time.Now()
			c.Logger.Info("waiting for a peer replica to hand this one the job CA (the first of --peers makes it)", "first", c.Peers[0], "errs", errs)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// askPeers asks each of addrs, at once, for the job CA; the first CA that
// comes, or every peer's error.
func askPeers(ctx context.Context, addrs []string, tok string) (*jobtls.CA, []error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		got  *jobtls.CA
		errs []error
		wg   sync.WaitGroup
	)
	for _, a := range addrs {
		wg.Go(func() {
			ca, err := askPeer(ctx, a, tok)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a, err))
			} else if got == nil {
				got = ca
				cancel()
			}
		})
	}
	wg.Wait()
	return got, errs
}

func askPeer(ctx context.Context, addr, tok string) (*jobtls.CA, error) {
	creds, err := jobtls.Trust{}.Credentials(tok, nil) // the proof of the token, both ways
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := gotrainv1.NewCoordinatorClient(conn).ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	return jobtls.ParseCA(resp.GetCaCert(), resp.GetCaKey())
}
