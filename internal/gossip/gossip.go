// Package gossip configures hashicorp/memberlist for gotrain's failure
// detection: the coordinator and every agent of a multi-node job run one
// memberlist node each, so that a node that stops answering (a dead machine,
// a hung or stopped agent) is declared dead in seconds rather than when gRPC
// keepalive (about 20 s) gives up on its connection.
//
// Gossip is encrypted with a key derived from the job token ([Key]): nodes of
// other jobs, or without the token, cannot join.
package gossip

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Timers, shortened from memberlist's LAN defaults (1 s, 500 ms, 4) for a
// cluster network. A node is probed about once per ProbeInterval times the
// number of members by each member; a probe fails after ProbeTimeout (direct)
// and the rest of the interval (indirect, TCP); the node is then suspect for
// SuspicionMult × max(1, log10(n)) × ProbeInterval (1 s below 10 nodes, 2 s
// at 100) before it is declared dead, unless it refutes. A dead node is
// seen in about 2–3 s; a healthy node must stay silent for well over a
// second to be declared dead by mistake.
const (
	ProbeInterval = 500 * time.Millisecond
	ProbeTimeout  = 250 * time.Millisecond
	SuspicionMult = 2
)

// keyLabel separates the gossip key from any other use of the job token.
const keyLabel = "gotrain/gossip/v1 key\x00"

// Key is the 32-byte AES-256 key the job's gossip is encrypted with:
// SHA-256 of a fixed label and the job token.
func Key(token string) []byte {
	sum := sha256.Sum256([]byte(keyLabel + token))
	return sum[:]
}

// Options configure one memberlist node.
type Options struct {
	// Name is the node's name in the member list (required): the agent's
	// node id, or CoordinatorName.
	Name string
	// BindAddr and Port are where the node listens (UDP and TCP); Port 0
	// picks a free port.
	BindAddr string
	Port     int
	// AdvertiseAddr is the address other members reach this one at
	// (default: BindAddr, or a private address when BindAddr is 0.0.0.0).
	AdvertiseAddr string
	// Token is the job token the gossip key is derived from (required).
	Token string
	// Events and Ping receive membership changes and probe answers; optional.
	Events memberlist.EventDelegate
	Ping   memberlist.PingDelegate
	// Logger receives memberlist's log lines at debug level; default: discard.
	Logger *slog.Logger
}

// CoordinatorName is the coordinator's name in the member list; agents are
// named by their node ids ("node-1", ...). The replicas of a replicated
// coordinator are CoordinatorName@ADDR (ReplicaName).
const CoordinatorName = "coordinator"

// ReplicaName is the member name of the coordinator replica at addr.
func ReplicaName(addr string) string { return CoordinatorName + "@" + addr }

// IsCoordinator says whether a member is the coordinator or one of its
// replicas (not an agent).
func IsCoordinator(name string) bool {
	return name == CoordinatorName || strings.HasPrefix(name, CoordinatorName+"@")
}

// KeepJoining joins ml to the member list through peers (any one that
// answers is enough), trying again every `every` until it works or stop is
// called: a join that fails (a peer not up yet, an overloaded machine
// missing its deadline) must not leave a member out for good.
func KeepJoining(ml *memberlist.Memberlist, peers []string, every time.Duration, log *slog.Logger) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for warned := false; ; {
			_, err := ml.Join(peers)
			if err == nil {
				log.Info("gossip joined", "peers", peers, "local", net.JoinHostPort(ml.LocalNode().Addr.String(), strconv.Itoa(int(ml.LocalNode().Port))))
				return
			}
			if !warned {
				warned = true
				log.Warn("gossip: cannot join the member list yet (is the UDP/TCP gossip port open?); trying again", "peers", peers, "err", err)
			}
			select {
			case <-quit:
				return
			case <-time.After(every):
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// Config returns memberlist's LAN config with gotrain's timers and o applied.
func Config(o Options) (*memberlist.Config, error) {
	if o.Name == "" {
		return nil, errors.New("gossip: node name is empty")
	}
	if o.Token == "" {
		return nil, errors.New("gossip: job token is empty")
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := memberlist.DefaultLANConfig()
	c.Name = o.Name
	c.BindAddr = o.BindAddr
	if c.BindAddr == "" {
		c.BindAddr = "0.0.0.0"
	}
	c.BindPort = o.Port
	c.AdvertiseAddr = o.AdvertiseAddr
	c.AdvertisePort = o.Port
	c.ProbeInterval = ProbeInterval
	c.ProbeTimeout = ProbeTimeout
	c.SuspicionMult = SuspicionMult
	c.SecretKey = Key(o.Token)
	c.Events = o.Events
	c.Ping = o.Ping
	c.Logger = slog.NewLogLogger(logger.Handler(), slog.LevelDebug)
	return c, nil
}

// Start creates a memberlist node from o.
func Start(o Options) (*memberlist.Memberlist, error) {
	c, err := Config(o)
	if err != nil {
		return nil, err
	}
	t, err := newTransport(c, o.Logger) // transport.go: bounded
	if err != nil {
		return nil, fmt.Errorf("gossip: start on %s:%d: %w", c.BindAddr, o.Port, err)
	}
	c.Transport = t
	ml, err := memberlist.Create(c)
	if err != nil {
		_ = t.Shutdown()
		return nil, fmt.Errorf("gossip: start on %s:%d: %w", c.BindAddr, o.Port, err)
	}
	return ml, nil
}
