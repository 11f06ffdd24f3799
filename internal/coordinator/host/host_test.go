package host

import (
	"context"
	"errors"
	"flag"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

const testToken = "test-token"

// rpcTimeout bounds every call a test makes.
const rpcTimeout = 30 * time.Second

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.JobToken, cfg.RunID, cfg.Listen = testToken, "run-test", "127.0.0.1:0"
	return cfg
}

func client(t *testing.T, addr string) (gotrainv1.CoordinatorClient, func()) {
	t.Helper()
	creds, err := jobtls.Trust{SkipCheck: true}.Credentials(testToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), token.DialOption(testToken))
	if err != nil {
		t.Fatal(err)
	}
	return gotrainv1.NewCoordinatorClient(cc), func() { _ = cc.Close() }
}

// csr is a node's certificate request, as a joining agent sends it.
func csr(t *testing.T) []byte {
	t.Helper()
	_, der, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func node(host string) *gotrainv1.NodeInfo {
	return &gotrainv1.NodeInfo{Hostname: host, Address: "127.0.0.1", Nproc: 1, FreePort: 1, AgentPid: 4000}
}

// The standalone host starts, serves gRPC and /metrics, and stops with no
// goroutine left behind.
func TestStartServeStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.MetricsAddr = "127.0.0.1:0"
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Config().MaxRestarts != DefaultMaxRestarts || c.GossipPort() != 0 {
		t.Errorf("config %+v, gossip port %d", c.Config(), c.GossipPort())
	}
	coord, closeConn := client(t, c.Addr().String())
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	key, der, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := coord.Join(ctx, &gotrainv1.JoinRequest{Node: node("host-a"), Csr: der})
	if err != nil || resp.GetRunId() != "run-test" || resp.GetMaxRestarts() != DefaultMaxRestarts {
		t.Fatalf("join: %v, %v", resp, err)
	}
	// The node attaches (its watch stream, with its certificate), and the
	// job starts.
	cert := jobtls.NodeCertificate(resp.GetNodeCert(), key)
	creds, err := jobtls.Trust{SkipCheck: true}.Credentials(testToken, &cert)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(c.Addr().String(), grpc.WithTransportCredentials(creds), token.DialOption(testToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := gotrainv1.NewCoordinatorClient(cc).WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: resp.GetNodeId()})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event %v, %v; want started", ev, err)
	}
	st, err := coord.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil || st.GetState() != "running" {
		t.Fatalf("status: %v, %v", st, err)
	}
	if c.MetricsAddr() == "" {
		t.Fatal("no metrics address")
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := hc.Get("http://" + c.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if !strings.Contains(string(body), `gotrain_job_world_size{run_id="run-test"} 1`) {
		t.Errorf("metrics lack the world size:\n%s", body)
	}
	closeConn()

	if err := c.Stop(); err != nil {
		t.Errorf("Stop = %v", err)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done not closed after Stop")
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop = %v", err)
	}
}

// Start's ctx ends serving: Done closes and Stop returns nil.
func TestContextStops(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(t.Context())
	c, err := Start(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-c.Done()
	if err := c.Stop(); err != nil {
		t.Errorf("Stop = %v", err)
	}
}

// With several nodes the coordinator gossips, Join hands out the port, and
// Stop takes the member list down too.
func TestGossip(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.Nodes, cfg.GossipPort = 2, 0
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if c.GossipPort() <= 0 {
		t.Fatalf("gossip port %d", c.GossipPort())
	}
	coord, closeConn := client(t, c.Addr().String())
	defer closeConn()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	resp, err := coord.Join(ctx, &gotrainv1.JoinRequest{Node: node("host-a"), Csr: csr(t)})
	if err != nil || int(resp.GetGossipPort()) != c.GossipPort() {
		t.Fatalf("join: %v, %v; want gossip port %d", resp, err, c.GossipPort())
	}
}

// A gossip that cannot start fails Start, unless it is best effort (the
// embedded coordinator): then the job runs without it.
func TestGossipFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.Nodes, cfg.Listen, cfg.GossipPort = 2, "0.0.0.0:0", 0
	cfg.AdvertiseAddr = func() (string, error) { return "", errors.New("no non-loopback IPv4 address found") }
	if c, err := Start(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "pass --no-gossip") {
		t.Errorf("Start = %v, want the gossip error naming --no-gossip", err)
		if c != nil {
			_ = c.Stop()
		}
	}
	cfg.GossipBestEffort = true
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.GossipPort() != 0 {
		t.Errorf("gossip port %d, want 0 (none)", c.GossipPort())
	}
	if err := c.Stop(); err != nil {
		t.Error(err)
	}
}

// A metrics address that is taken fails Start, naming the flag, and leaves
// nothing running (the gRPC listener is closed again).
func TestStartFailsCleanly(t *testing.T) {
	defer goleak.VerifyNone(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := testConfig()
	cfg.MetricsAddr = taken.Addr().String()
	c, err := Start(t.Context(), cfg)
	if err == nil {
		_ = c.Stop()
		t.Fatal("Start succeeded on a taken metrics address")
	}
	if !strings.Contains(err.Error(), "choose another with --metrics-addr") {
		t.Errorf("err = %v", err)
	}

	cfg = testConfig()
	cfg.Listen, cfg.ListenFlag = taken.Addr().String(), "--coordinator-listen"
	if _, err := Start(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "choose another with --coordinator-listen") {
		t.Errorf("Start on a taken listen address = %v", err)
	}
}

func TestDefaults(t *testing.T) {
	d := DefaultConfig()
	want := JobSettings{Config: job.Config{Nodes: 1, MinNodes: 1, NodeTimeout: 10 * time.Second, JoinSettle: 3 * time.Second,
		MaxRestarts: 3, OnHang: "report", OnStraggler: "report", StragglerPersist: 30 * time.Second, RendezvousTimeout: 10 * time.Minute}}
	if d.JobSettings != want || d.Listen != "0.0.0.0:29400" || d.GossipPort != GossipPortFromListen || d.ListenFlag != "--listen" {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	if err := d.validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	// Built in code: the zero values with a default other than zero get it,
	// the token and a random run id are made.
	c := Config{}.withDefaults()
	if c.Nodes != 1 || c.HangTimeout != DefaultHangTimeout || c.OnHang != "report" || c.MaxRestarts != 0 ||
		c.JobToken == "" || !runIDPattern.MatchString(c.RunID) || c.Listen != DefaultListen || c.Logger == nil {
		t.Errorf("Config{}.withDefaults() = %+v", c)
	}
	if err := c.validate(); err != nil {
		t.Errorf("Config{}.withDefaults() does not validate: %v", err)
	}
}

var runIDPattern = regexp.MustCompile(`^gotrain-[0-9a-f]{8}$`)

// The run id (shown in logs, TORCHELASTIC_RUN_ID and the
// unauthenticated /metrics) gave away the token's first 8 characters:
// --job-token right gave run id gotrain-right. Now it is random.
func TestRunIDNotDerivedFromToken(t *testing.T) {
	seen := map[string]bool{}
	for _, tok := range []string{"right", "0123456789abcdef", "0123456789abcdef"} {
		c := Config{JobSettings: JobSettings{JobToken: tok}}.withDefaults()
		if !runIDPattern.MatchString(c.RunID) || strings.Contains(c.RunID, tok[:min(5, len(tok))]) {
			t.Errorf("token %q: run id %q gives the token away or is not gotrain-XXXXXXXX", tok, c.RunID)
		}
		if seen[c.RunID] {
			t.Errorf("run id %q made twice", c.RunID)
		}
		seen[c.RunID] = true
	}
	// A run id given stays.
	if c := (Config{JobSettings: JobSettings{Config: job.Config{RunID: "mine"}, JobToken: "x"}}).withDefaults(); c.RunID != "mine" {
		t.Errorf("a given run id became %q", c.RunID)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		change func(*Config)
		msg    string
		// zeroDefaults: Start (withDefaults) takes this zero as the
		// default; only the flags' validation refuses it.
		zeroDefaults bool
	}{
		{func(c *Config) { c.Nodes = 0 }, "--nnodes 0", true},
		{func(c *Config) { c.MaxRestarts = -1 }, "--max-restarts -1", false},
		{func(c *Config) { c.RestartBackoff = -time.Second }, "--restart-backoff -1s", false},
		{func(c *Config) { c.HangTimeout = -time.Second }, "--hang-timeout -1s", false},
		{func(c *Config) { c.OnHang = "never" }, `--on-hang "never"`, false},
		{func(c *Config) { c.OnStraggler = "restart" }, `--on-straggler "restart"`, false},
		{func(c *Config) { c.StragglerPersist = -time.Second }, "--straggler-persist -1s", false},
		{func(c *Config) { c.RendezvousTimeout = -time.Second }, "--rendezvous-timeout -1s", false},
		{func(c *Config) { c.Listen = "29400" }, `--listen "29400"`, false},
		{func(c *Config) { c.Listen, c.ListenFlag = "x", "--coordinator-listen" }, `--coordinator-listen "x"`, false},
		{func(c *Config) { c.MetricsAddr = "9400" }, `--metrics-addr "9400"`, false},
		{func(c *Config) { c.GossipPort = 70000 }, "--gossip-port 70000", false},
		{func(c *Config) { c.GossipPort = -2 }, "--gossip-port -2", false},
	} {
		cfg := testConfig()
		tc.change(&cfg)
		err := cfg.validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Msg != tc.msg || ce.Hint == "" {
			t.Errorf("validate() = %#v, want a ConfigError %q with a hint", err, tc.msg)
		}
		if tc.zeroDefaults {
			continue
		}
		if _, err := Start(t.Context(), cfg); !errors.As(err, &ce) {
			t.Errorf("Start = %v, want the ConfigError", err)
		}
	}
}

func TestJoinAddress(t *testing.T) {
	for _, tc := range []struct {
		lis  *net.TCPAddr
		node string
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 29400}, "10.0.0.1", "10.0.0.1:29400"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 29400}, "10.0.0.1", "10.0.0.1:29400"},
		{&net.TCPAddr{IP: net.ParseIP("192.168.1.5"), Port: 1234}, "10.0.0.1", "192.168.1.5:1234"},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 41000}, "127.0.0.1", "127.0.0.1:41000"},
		{&net.TCPAddr{IP: net.IPv6zero, Port: 29400}, "fd00::1", "[fd00::1]:29400"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 29400}, "THIS_HOST", "THIS_HOST:29400"},
	} {
		if got := JoinAddress(tc.lis, tc.node); got != tc.want {
			t.Errorf("JoinAddress(%s, %s) = %s, want %s", tc.lis, tc.node, got, tc.want)
		}
	}
}

// Given sends exactly the settings whose flags were given, whatever their
// values (a default given explicitly is still given).
func TestGiven(t *testing.T) {
	s := DefaultJobSettings()
	s.MaxRestarts, s.RunID = 5, "run-x"
	for _, tc := range []struct {
		given map[string]bool
		want  *gotrainv1.JobSettings
	}{
		{nil, nil},
		{map[string]bool{"gpus": true, FlagJobToken: true, FlagMetricsAddr: true, FlagNoGossip: true}, nil},
		{map[string]bool{FlagMaxRestarts: true}, &gotrainv1.JobSettings{MaxRestarts: proto.Int32(5)}},
		{map[string]bool{FlagNodes: true, FlagHangTimeout: true, FlagOnHang: true},
			&gotrainv1.JobSettings{Nodes: proto.Int32(1), MinNodes: proto.Int32(1), HangTimeoutMs: proto.Int64(0), OnHang: proto.String("report")}},
		{map[string]bool{FlagOnStraggler: true, FlagStragglerPersist: true},
			&gotrainv1.JobSettings{OnStraggler: proto.String("report"), StragglerPersistMs: proto.Int64(30_000)}},
		{map[string]bool{FlagRestartBackoff: true, FlagRendezvousTimeout: true, FlagRunID: true},
			&gotrainv1.JobSettings{RestartBackoffMs: proto.Int64(0), RendezvousTimeoutMs: proto.Int64(600_000), RunId: proto.String("run-x")}},
	} {
		if got := s.Given(tc.given); !proto.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("Given(%v) = %v, want %v", tc.given, got, tc.want)
		}
	}
}

// RegisterJobFlags gives every flag DefaultJobSettings' value, and parsing
// fills the settings.
func TestRegisterJobFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var s JobSettings
	RegisterJobFlags(fs, &s, "env-token")
	want := DefaultJobSettings()
	want.JobToken = "env-token"
	if s != want {
		t.Errorf("before parsing: %+v, want %+v", s, want)
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n != 15 {
		t.Errorf("%d flags, want 15", n)
	}
	if err := fs.Parse([]string{"--nnodes", "2", "--max-restarts", "0", "--hang-timeout", "5m", "--on-hang", "restart", "--no-gossip",
		"--on-straggler", "replace", "--straggler-persist", "10s"}); err != nil {
		t.Fatal(err)
	}
	if s.Nodes != 2 || s.MaxRestarts != 0 || s.HangTimeout != 5*time.Minute || s.OnHang != "restart" || !s.NoGossip ||
		s.OnStraggler != "replace" || s.StragglerPersist != 10*time.Second {
		t.Errorf("after parsing: %+v", s)
	}
}

// --nnodes takes N or MIN:MAX (torchrun's syntax), and says what it wants
// otherwise.
func TestNNodes(t *testing.T) {
	for v, want := range map[string][2]int{"4": {4, 4}, "3:4": {3, 4}, "1:1": {1, 1}} {
		min, max, err := ParseNNodes(v)
		if err != nil || min != want[0] || max != want[1] {
			t.Errorf("ParseNNodes(%q) = %d, %d, %v; want %v", v, min, max, err, want)
		}
	}
	for _, v := range []string{"0", "4:3", "a", "2:", ":2", "-1:2"} {
		if _, _, err := ParseNNodes(v); err == nil || !strings.Contains(err.Error(), "MIN:MAX") {
			t.Errorf("ParseNNodes(%q) = %v; want an error that says what is allowed", v, err)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var s JobSettings
	RegisterJobFlags(fs, &s, "")
	if err := fs.Parse([]string{"--nnodes", "3:4"}); err != nil || s.MinNodes != 3 || s.Nodes != 4 || fs.Lookup(FlagNodes).Value.String() != "3:4" {
		t.Errorf("--nnodes 3:4: %+v, %v", s, err)
	}
}

// TestReplicasScaleWithTheJob: the default replica set is 5 from 5 nodes
// (two may be lost at once), 3 with 3 or 4, none below; a given count
// holds.
func TestReplicasScaleWithTheJob(t *testing.T) {
	for _, c := range []struct{ nodes, given, want int }{
		{1, 0, 1}, {2, 0, 1}, {3, 0, 3}, {4, 0, 3}, {5, 0, 5}, {128, 0, 5}, {5, 3, 3}, {8, 1, 1},
	} {
		if got := (JobSettings{Config: job.Config{Nodes: c.nodes}, CoordinatorReplicas: c.given}).Replicas(); got != c.want {
			t.Errorf("--nnodes %d --coordinator-replicas %d: %d replicas, want %d", c.nodes, c.given, got, c.want)
		}
	}
}
