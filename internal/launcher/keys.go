package launcher

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/metadata"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The agent's side of the job's keys. Every connection to the
// coordinator proves the job token both ways (jobtls); a joiner without a
// pin (--ca-hash) pins, after Join, the CA the coordinator presented, so
// that every later connection (to any replica, after any blip) must
// present that CA. The job CA's certificate from Join verifies the
// followers' leader hints (signed by the replica set's key): a hint that
// fails is ignored, with a log line. A node asked to host a replica gets
// the CA's key from the coordinator over its own node connection.

// keysView is what the agent holds of the job's keys.
type keysView struct {
	keysMu   sync.Mutex
	trust    jobtls.Trust      // the trust every connection after Join uses
	jobCA    *x509.Certificate // the job CA, from Join; nil before
	hintTerm uint64            // the highest term of a hint followed
	joinCA   []byte            // the job CA's certificate Join named (DER)
}

// learnKeys takes, after Join, the pin and the job CA: the CA the joining
// connection presented (proven) is pinned from now on when no pin was
// given, and the job CA Join names verifies leader hints.
func (a *agent) learnKeys(trust jobtls.Trust, proven jobtls.Proven, caDER []byte) (jobtls.Trust, error) {
	if trust.CAFile == "" && trust.CAHash == "" && proven.Pin != "" {
		trust = jobtls.Trust{CAHash: proven.Pin}
	}
	a.keysMu.Lock()
	defer a.keysMu.Unlock()
	a.trust = trust
	if len(caDER) == 0 {
		return trust, nil // a coordinator without a job CA (tests): no hint is believed
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil || !ca.IsCA {
		return trust, fmt.Errorf("the coordinator's job CA (from Join) is not a CA: %v", err)
	}
	// Join's answer came over a connection that proved the token and
	// passed the pin (or the site's PKI): its CA is the job's.
	a.jobCA = ca
	return trust, nil
}

// checkHint is the connection's check of a follower's leader hint
// (leaderconn.WithHintCheck): the job CA's signature of the leader and a
// term no older than the last hint followed.
func (a *agent) checkHint(leader string, md metadata.MD) error {
	err := a.verifyHint(leader, md)
	if err != nil {
		a.log.Warn("a coordinator replica's leader hint ignored", "leader", leader, "err", err)
	}
	return err
}

func (a *agent) verifyHint(leader string, md metadata.MD) error {
	term, sig64 := leaderconn.Hint(md)
	a.keysMu.Lock()
	defer a.keysMu.Unlock()
	if a.jobCA == nil {
		return errors.New("no job CA known yet (before Join): a hint cannot be checked")
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil || sig64 == "" {
		return errors.New("the hint is not signed by the replica set")
	}
	if err := jobtls.VerifySigned(a.jobCA, leaderconn.HintMessage(leader, term), sig); err != nil {
		return err
	}
	if term < a.hintTerm {
		return fmt.Errorf("the hint is of term %d, older than term %d's", term, a.hintTerm)
	}
	a.hintTerm = term
	return nil
}

// replicaCA asks the coordinator, with this node's certificate, for the
// job CA that the replica it was asked to host needs.
func (a *agent) replicaCA(ctx context.Context) (*jobtls.CA, error) {
	resp, err := a.coord.ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{NodeId: a.nodeID})
	if err != nil {
		return nil, err
	}
	ca, err := jobtls.ParseCA(resp.GetCaCert(), resp.GetCaKey())
	if err != nil {
		return nil, err
	}
	a.keysMu.Lock()
	want := a.jobCA
	a.keysMu.Unlock()
	if want != nil && jobtls.Hash(ca.Cert) != jobtls.Hash(want) {
		return nil, fmt.Errorf("the coordinator handed CA %s, not the job's %s", ca.Hash(), jobtls.Hash(want))
	}
	return ca, nil
}

// restarted is the agent's verdict on a connection refused because the
// coordinator proves the token under another CA than the one pinned: it
// restarted with a new identity and lost the job's state; nil otherwise.
func restarted(err error) error {
	if err == nil || !errors.Is(err, jobtls.ErrNewIdentity) && !containsNewIdentity(err) {
		return nil
	}
	return &coordinatorRestarted{msg: verifyFailure(err)}
}

// containsNewIdentity: gRPC hands a handshake's error on as text.
func containsNewIdentity(err error) bool {
	return strings.Contains(verifyFailure(err), "restarted with a new identity")
}

// restartedExit is the agent's exit after its coordinator restarted with
// a new identity (err, a *coordinatorRestarted).
func (a *agent) restartedExit(err error) error {
	return &ExitError{Code: 1, Message: err.Error() + "; this node's workers on " + a.host + " were stopped"}
}

// coordinatorRestarted ends the agent: the coordinator cannot continue
// the job.
type coordinatorRestarted struct{ msg string }

func (e *coordinatorRestarted) Error() string {
	return "gotrain: " + strings.TrimPrefix(e.msg, "jobtls: ")
}
