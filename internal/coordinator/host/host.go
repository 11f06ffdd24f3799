// Package host runs a gotrain job's coordinator: the one function that both
// `gotrain coordinator` (standalone) and `gotrain launch` (the coordinator
// embedded in the first node's agent) use to build, listen, gossip, serve
// metrics and serve gRPC, with one set of job-wide settings (JobSettings),
// one set of defaults and one validation. RegisterJobFlags registers those
// settings' flags for both commands.
//
// # Usage
//
//	cfg := host.DefaultConfig()
//	cfg.Nodes, cfg.JobToken = 2, tok
//	c, err := host.Start(ctx, cfg)
//	if err != nil { ... }
//	defer c.Stop()
//	fmt.Println("agents join", c.Addr())
//	select {
//	case <-c.Finished(): // c.Result() says how
//	case <-c.Done(): // serving ended early: c.Stop() returns why
//	}
package host

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/gotrain/gotrain/internal/connguard"
	"github.com/gotrain/gotrain/internal/coordinator"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// DefaultListen is where a coordinator listens by default.
const DefaultListen = "0.0.0.0:29400"

// GossipPortFromListen, as Config.GossipPort, gossips at the listen port + 1
// (any free port when the listen port is 0).
const GossipPortFromListen = -1

// Config configures a hosted coordinator. Start from DefaultConfig.
type Config struct {
	JobSettings

	// Listen is where the coordinator serves gRPC (HOST:PORT; default
	// DefaultListen).
	Listen string
	// ListenFlag is the flag that sets Listen, named in errors (default
	// "--listen").
	ListenFlag string
	// GossipPort is the coordinator's memberlist port (UDP+TCP) when the
	// job gossips (Nodes > 1 and not NoGossip): GossipPortFromListen, or a
	// port (0: any free one). Agents learn it from Join.
	GossipPort int
	// AdvertiseAddr returns the address agents reach this host at, which
	// gossip advertises when Listen is on all interfaces. Called only then;
	// nil: gossip fails there.
	AdvertiseAddr func() (string, error)
	// GossipBestEffort makes a gossip that cannot start a warning (the
	// coordinator runs without it: broken streams and keepalive still find
	// lost nodes) instead of Start's error.
	GossipBestEffort bool
	// Logger receives the coordinator's log (default: discard).
	Logger *slog.Logger
	// TLSCert and TLSKey, when set, are the certificate and key (PEM files)
	// of the site's own PKI that the coordinator presents; agents then
	// verify it with --tls-ca. Empty: a certificate from the job CA, which
	// agents verify by its hash (CAHash). Either way the job CA issues the
	// nodes' own certificates.
	TLSCert, TLSKey string
	// CA, when not nil, is the job CA to use instead of a new one (a caller
	// that hands its hash out before the coordinator starts).
	CA *jobtls.CA

	// Replication (replicas.go). Peers: the whole replica set of a
	// standalone replicated coordinator (gRPC HOST:PORT each, Listen among
	// them, the same list on every replica). Replicas: the embedded first
	// node's, how many replicas to keep (JobSettings.Replicas). JoinReplica:
	// this is a replica a joining node hosts at Join's request; it waits to
	// be added (AddReplica). GossipJoin: other replicas' gossip addresses.
	Peers       []string
	Replicas    int
	JoinReplica bool
	GossipJoin  []string
	// maxRaftLog bounds the replica's log (replica.Config.MaxLogBytes);
	// 0: replica's default. Tests set a small one.
	maxRaftLog int64
}

// DefaultConfig returns a Config with every default: DefaultJobSettings,
// DefaultListen, the gossip port from the listen port.
func DefaultConfig() Config {
	return Config{JobSettings: DefaultJobSettings(), Listen: DefaultListen, ListenFlag: "--listen", GossipPort: GossipPortFromListen}
}

// withDefaults fills what a Config built in code may leave zero: a new token,
// a new random run id (NewRunID), Nodes, HangTimeout, OnHang, Listen, ListenFlag, Logger.
func (c Config) withDefaults() Config {
	if c.JobToken == "" {
		c.JobToken = token.Generate()
	}
	c.JobSettings = c.JobSettings.WithDefaults()
	if c.RunID == "" {
		c.RunID = NewRunID()
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.ListenFlag == "" {
		c.ListenFlag = "--listen"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	if err := c.JobSettings.Validate(); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return &ConfigError{Msg: fmt.Sprintf("%s %q", c.ListenFlag, c.Listen), Hint: "Give HOST:PORT, e.g. 0.0.0.0:29400."}
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return &ConfigError{Msg: fmt.Sprintf("--%s %q", FlagMetricsAddr, c.MetricsAddr), Hint: "Give HOST:PORT, e.g. 0.0.0.0:9400."}
		}
	}
	if err := c.validateReplicas(); err != nil {
		return err
	}
	if c.GossipPort < GossipPortFromListen || c.GossipPort > 65535 {
		return &ConfigError{Msg: fmt.Sprintf("--gossip-port %d", c.GossipPort), Hint: "Give a port between 0 (any free one) and 65535."}
	}
	return nil
}

// gossips says whether the job gossips: only with several nodes, and not
// with NoGossip.
func (c Config) gossips() bool { return (c.Nodes > 1 || c.replicated()) && !c.NoGossip }

// Coordinator is a coordinator started by Start. Stop it once.
type Coordinator struct {
	cfg         Config
	srv         *coordinator.Server
	addr        *net.TCPAddr
	metricsAddr string
	gossipPort  int
	stopGossip  func()

	cancel context.CancelFunc
	group  *errgroup.Group
	done   chan struct{} // closed when every goroutine of group returned

	stopOnce sync.Once
	err      error

	ca  *jobtls.CA // the job CA: issues node certificates, and the server's unless TLSCert
	pin string     // what local tools pin: the job CA's hash, or the site certificate's own
	// hostKey is the secret the agent that embeds this coordinator joins
	// with, to be the job's first node (coordinator.Config.HostKey).
	hostKey []byte

	replica *replica.Node // nil when not replicated (replicas.go)
}

// Start builds the job's coordinator from cfg, listens on cfg.Listen (and
// cfg.MetricsAddr), starts gossip (before any agent can join) and serves
// until ctx is done or Stop. The goroutines it starts are all joined by
// Stop. On error nothing is left running.
func Start(ctx context.Context, cfg Config) (_ *Coordinator, err error) {
	runIDGiven := cfg.RunID != ""
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	ca, srvCert, pin, err := cfg.credentials(ctx) // tls.go
	if err != nil {
		return nil, err
	}
	hostKey := make([]byte, 32)
	if _, err := rand.Read(hostKey); err != nil {
		return nil, fmt.Errorf("make the coordinator's host key: %w", err)
	}
	if !runIDGiven && len(cfg.Peers) > 1 {
		// Standalone replicas start apart: each would make its own.
		cfg.RunID = replicasRunID(ca)
	}
	srv, err := coordinator.New(coordinator.Config{
		TLS: jobtls.ServerConfig(srvCert, ca), CA: ca, HostKey: hostKey,
		Job: cfg.JobSettings.Config, Token: cfg.JobToken, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range undo {
				f()
			}
		}
	}()
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (choose another with %s)", cfg.Listen, err, cfg.ListenFlag)
	}
	lis = connguard.Listen(lis, "the coordinator's gRPC port", GRPCLimits, log) // bounds.go
	undo = append(undo, func() { _ = lis.Close() })
	var mlis net.Listener
	if cfg.MetricsAddr != "" {
		if mlis, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("serve metrics on %s: %w (choose another with --%s)", cfg.MetricsAddr, err, FlagMetricsAddr)
		}
		mlis = connguard.Listen(mlis, "the coordinator's /metrics port", MetricsLimits, log) // bounds.go
		undo = append(undo, func() { _ = mlis.Close() })
	}
	c := &Coordinator{cfg: cfg, srv: srv, addr: lis.Addr().(*net.TCPAddr), stopGossip: func() {}, done: make(chan struct{}), ca: ca, pin: pin, hostKey: hostKey}
	if mlis != nil {
		c.metricsAddr = mlis.Addr().String()
	}
	if cfg.replicated() {
		if err := c.startReplica(srv); err != nil { // replicas.go
			return nil, fmt.Errorf("start the coordinator's replica: %w", err)
		}
		undo = append(undo, c.replica.Stop)
	}
	if cfg.gossips() {
		if err := c.startGossip(); err != nil {
			if !cfg.GossipBestEffort {
				return nil, err
			}
			log.Warn("no gossip: lost nodes are found by their broken streams only (about 20 s for a dead machine)", "err", err)
		}
	}

	ctx, c.cancel = context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	c.group = g
	g.Go(func() error { return srv.Serve(gctx, lis) })
	if mlis != nil {
		g.Go(func() error {
			// Metrics are a window on the job, not part of it: a failure is
			// logged and the coordinator goes on.
			if err := srv.ServeMetrics(gctx, mlis); err != nil {
				log.Warn("metrics", "err", err)
			}
			return nil
		})
	}
	go func() { _ = g.Wait(); close(c.done) }() // joined by Stop, which waits for done
	return c, nil
}

// startGossip runs the coordinator's memberlist node on its listen host, at
// cfg.GossipPort.
func (c *Coordinator) startGossip() error {
	port := c.cfg.GossipPort
	if port == GossipPortFromListen {
		port = coordinator.DefaultGossipPort(c.cfg.Listen)
	}
	var advertise string
	if c.addr.IP.IsUnspecified() {
		if c.cfg.AdvertiseAddr == nil {
			return errors.New("gossip: listening on all interfaces and no address to advertise (pass --no-gossip, or " + c.cfg.ListenFlag + " on this host's address)")
		}
		var err error
		if advertise, err = c.cfg.AdvertiseAddr(); err != nil {
			return fmt.Errorf("gossip: %w (pass --no-gossip, or %s on this host's address)", err, c.cfg.ListenFlag)
		}
	}
	gcfg := coordinator.GossipBind(c.addr, port, advertise)
	gcfg.Name = c.gossipName() // replicas.go
	gcfg.Join = c.cfg.gossipJoin(c.ReplicaID())
	gport, stop, err := c.srv.StartGossip(gcfg)
	if err != nil {
		return fmt.Errorf("%w (choose another port with --gossip-port, or pass --no-gossip)", err)
	}
	c.gossipPort, c.stopGossip = gport, stop
	return nil
}

// HostKey is the secret the agent that embeds this coordinator gives in
// its Join (JoinRequest.host_key) to be the job's first node, group rank 0
// and MASTER_ADDR, whatever joined before it. Keep it in memory only.
func (c *Coordinator) HostKey() []byte { return c.hostKey }

// Config returns the coordinator's configuration, defaults filled in (the
// token and run id too).
func (c *Coordinator) Config() Config { return c.cfg }

// Addr is where the coordinator serves gRPC.
func (c *Coordinator) Addr() *net.TCPAddr { return c.addr }

// JoinAddr is the HOST:PORT agents join at (JoinAddress).
func (c *Coordinator) JoinAddr(host string) string { return JoinAddress(c.addr, host) }

// JoinAddress is where agents reach a coordinator listening on lis: the
// listening address itself, or host (this node's address) when it listens
// on all interfaces.
func JoinAddress(lis *net.TCPAddr, host string) string {
	if !lis.IP.IsUnspecified() {
		host = lis.IP.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(lis.Port))
}

// MetricsAddr is where /metrics is served; "" when metrics are off.
func (c *Coordinator) MetricsAddr() string { return c.metricsAddr }

// GossipPort is the coordinator's memberlist port; 0 when it does not gossip.
func (c *Coordinator) GossipPort() int { return c.gossipPort }

// Finished is closed once the job finished, successfully or not.
func (c *Coordinator) Finished() <-chan struct{} { return c.srv.Finished() }

// Status is the job's state as this coordinator sees it (gotrain top's).
func (c *Coordinator) Status() *gotrainv1.JobStatus {
	st, _ := c.srv.GetJobStatus(context.Background(), &gotrainv1.GetJobStatusRequest{})
	return st
}

// Result returns how the job finished, or nil before Finished is closed.
func (c *Coordinator) Result() *gotrainv1.JobFinished { return c.srv.Result() }

// Done is closed when serving ended: Start's ctx is done, Stop was called,
// or serving failed (Stop returns why).
func (c *Coordinator) Done() <-chan struct{} { return c.done }

// Stop stops serving (calls that wait end with Unavailable; see
// coordinator.Server.Serve), stops gossip and returns once every goroutine
// Start started has returned. It returns the error that ended serving, nil
// when ctx or Stop did. Calls after the first return the same.
func (c *Coordinator) Stop() error {
	c.stopOnce.Do(func() {
		c.cancel()
		<-c.done
		c.err = c.group.Wait()
		c.stopGossip()
		if c.replica != nil {
			c.replica.Stop()
		}
	})
	return c.err
}
