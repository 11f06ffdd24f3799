package slurm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/connguard"
)

// The token exchange: how the agents of a step agree on a job token with
// nothing to copy and nothing secret printed.
//
// Node 0's agent makes a random token and serves it at the step's
// ExchangePort. An agent of another node connects and sends a MUNGE
// credential with the payload "gotrain token request JOB.STEP"; node 0
// decodes it (munged checks its signature, its time to live, and that it was
// not used before), requires that it was made by node 0's own uid and names
// this step, and answers with a credential carrying the token that only
// that uid can decode. The joiner decodes it and requires that node 0's
// agent runs as its own uid too: it trusts the coordinator because munge
// says it is the same user.
//
// Threat model: other users of the cluster (their jobs, their shells on
// the nodes or on the network) learn nothing and cannot join: their
// credentials carry their uid (refused), the answers are restricted to the
// job's uid (a captured answer cannot be decoded), and a replayed request
// is refused by munged. Root and the job's own user are trusted, as they
// are by Slurm itself. Without munge (or munged) there is no token: the
// agents say to pass --job-token instead.

// exchangeTimeout bounds one exchange on either side.
const exchangeTimeout = 10 * time.Second

// Connection bounds of the exchange port: 16 silent
// connections used to keep every joiner out (the 17th was closed at once).
// Now a connection that has not shown a valid credential has
// exchangeTimeout, and a budget where a flood evicts its own connections
// first, never a joiner's; one whose credential munge decoded is
// authenticated (it is answered and closed at once). maxMunge bounds the
// munge processes run at once; the others wait their turn.
const (
	maxExchangePending          = 64
	maxExchangePendingPerSource = 8
	maxExchangeAuthenticated    = 16
	maxMunge                    = 16
)

var exchangeLimits = connguard.Limits{
	Unauthenticated: maxExchangePending, UnauthenticatedPerSource: maxExchangePendingPerSource, HandshakeTimeout: exchangeTimeout,
	Authenticated: maxExchangeAuthenticated,
}

// ErrRefused: node 0's agent refused this agent's request (another user's
// job, another step).
var ErrRefused = errors.New("slurm: token refused")

func requestPayload(step string) string { return "gotrain token request " + step }
func answerPrefix(step string) string   { return "gotrain token " + step + " " }

// Grant is what node 0's agent hands out: the job token and, where the
// coordinator speaks TLS with a job CA, the CA's hash, so that a joiner
// trusts the coordinator without a hash printed and copied.
type Grant struct{ Token, CAHash string }

func (g Grant) encode() string {
	if g.CAHash == "" {
		return g.Token
	}
	return g.Token + " " + g.CAHash
}

// decodeGrant reads what encode wrote: the token, then the CA's hash after
// one space if there is one; anything else is not a grant.
func decodeGrant(s string) (Grant, bool) {
	tok, ca, hasCA := strings.Cut(s, " ")
	ok := tok != "" && !strings.ContainsAny(s, "\n\r") && !strings.Contains(ca, " ") && (!hasCA || ca != "")
	return Grant{Token: tok, CAHash: ca}, ok
}

// Serve hands g out on ln to the agents of step (JOB.STEP) whose munge
// credential says uid, until ctx ends. It closes ln.
func Serve(ctx context.Context, ln net.Listener, m Munge, uid int, step string, g Grant, log *slog.Logger) {
	ln = connguard.Listen(ln, "the Slurm token exchange port", exchangeLimits, log)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	sem := make(chan struct{}, maxMunge) // munge runs a process per credential
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("slurm token exchange: accept", "err", err)
			}
			return
		}
		go func() {
			defer conn.Close()
			if err := answer(ctx, conn.(*connguard.Conn), sem, m, uid, step, g); err != nil {
				log.Warn("slurm token exchange: refused", "from", conn.RemoteAddr().String(), "err", err)
				fmt.Fprintf(conn, "error: %v\n", err)
			}
		}()
	}
}

func answer(ctx context.Context, conn *connguard.Conn, sem chan struct{}, m Munge, uid int, step string, g Grant) error {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	_ = conn.SetDeadline(time.Now().Add(exchangeTimeout))
	line, err := readLine(conn)
	if err != nil {
		return err
	}
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return ctx.Err()
	}
	from, payload, err := m.Decode(ctx, line)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if from != uid {
		return fmt.Errorf("%w: the request comes from uid %d, the job runs as uid %d", ErrRefused, from, uid)
	}
	if payload != requestPayload(step) {
		return fmt.Errorf("%w: the request is for %q, this is step %s", ErrRefused, payload, step)
	}
	if err := conn.MarkAuthenticated(); err != nil { // the job's own user, munge says
		return err
	}
	cred, err := m.Encode(ctx, answerPrefix(step)+g.encode(), uid)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(conn, "%s\n", cred)
	return err
}

// Fetch gets the grant of step from node 0's agent at addr, trying
// again until ctx ends while it is not there yet.
func Fetch(ctx context.Context, addr string, m Munge, uid int, step string) (Grant, error) {
	var last error
	for {
		g, err := fetchOnce(ctx, addr, m, uid, step)
		if err == nil || errors.Is(err, ErrRefused) {
			return g, err
		}
		last = err
		select {
		case <-ctx.Done():
			return Grant{}, fmt.Errorf("get the job token from %s: %w (last: %v)", addr, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func fetchOnce(ctx context.Context, addr string, m Munge, uid int, step string) (Grant, error) {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	req, err := m.Encode(ctx, requestPayload(step), uid)
	if err != nil {
		return Grant{}, fmt.Errorf("%w: %v", ErrRefused, err) // no munge here: trying again will not help
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Grant{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := fmt.Fprintf(conn, "%s\n", req); err != nil {
		return Grant{}, err
	}
	line, err := readLine(conn)
	if err != nil {
		return Grant{}, err
	}
	if msg, ok := strings.CutPrefix(line, "error: "); ok {
		return Grant{}, fmt.Errorf("%w by %s: %s", ErrRefused, addr, msg)
	}
	from, payload, err := m.Decode(ctx, line)
	if err != nil {
		return Grant{}, fmt.Errorf("%w: the answer of %s: %v", ErrRefused, addr, err)
	}
	rest, ok := strings.CutPrefix(payload, answerPrefix(step))
	g, valid := decodeGrant(rest)
	if from != uid || !ok || !valid {
		return Grant{}, fmt.Errorf("%w: %s is not this job's agent (uid %d, payload for another step)", ErrRefused, addr, from)
	}
	return g, nil
}

func readLine(conn net.Conn) (string, error) {
	r := bufio.NewReaderSize(conn, 4096)
	line, err := r.ReadSlice('\n')
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	return strings.TrimSpace(string(line)), nil
}
