package slurm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/connguard/connguardtest"
	"github.com/gotrain/gotrain/internal/launcher"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// step2 is `srun -N2 --ntasks-per-node=1` as seen on its second node.
var step2 = []string{EnvJobID, "17", EnvStepID, "0", EnvStepNodeList, "node[1-2]", EnvStepNumNodes, "2",
	EnvNodeID, "1", EnvLocalID, "0", EnvTasksPerNode, "1(x2)"}

func with(base []string, kv ...string) []string { return append(append([]string(nil), base...), kv...) }

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want string // Step as %+v, "" for nil, "error" for an ErrStep
	}{
		{"not slurm", nil, ""},
		{"batch script (no step)", []string{EnvJobID, "17", "SLURM_NODELIST", "node[1-2]"}, ""},
		{"off", with(step2, EnvOff, "off"), ""},
		{"two nodes", step2, "{JobID:17 StepID:0 Nodes:[node1 node2] NodeID:1 LocalID:0 TasksOnNode:1 RestartCount:0}"},
		{"part of the allocation", []string{EnvJobID, "9", EnvStepID, "2", "SLURM_JOB_NODELIST", "node[1-3]", EnvStepNodeList, "node[2-3]",
			EnvNodeID, "0", EnvLocalID, "0"}, "{JobID:9 StepID:2 Nodes:[node2 node3] NodeID:0 LocalID:0 TasksOnNode:1 RestartCount:0}"},
		{"task per GPU", with(step2, EnvTasksPerNode, "2(x2)", EnvLocalID, "1"), "{JobID:17 StepID:0 Nodes:[node1 node2] NodeID:1 LocalID:1 TasksOnNode:2 RestartCount:0}"},
		{"uneven tasks", with(step2, EnvTasksPerNode, "4,2", EnvNodeID, "0"), "{JobID:17 StepID:0 Nodes:[node1 node2] NodeID:0 LocalID:0 TasksOnNode:4 RestartCount:0}"},
		{"requeued", with(step2, EnvRestartCount, "3"), "{JobID:17 StepID:0 Nodes:[node1 node2] NodeID:1 LocalID:0 TasksOnNode:1 RestartCount:3}"},
		{"node id out of the step", with(step2, EnvNodeID, "2"), "error"},
		{"node count differs", with(step2, EnvStepNumNodes, "3"), "error"},
		{"tasks count differs", with(step2, EnvTasksPerNode, "1(x3)"), "error"},
		{"local id past the tasks", with(step2, EnvLocalID, "1"), "error"},
		{"bad hostlist", with(step2, EnvStepNodeList, "node[2-1]"), "error"},
		{"bad job id", with(step2, EnvJobID, "x"), "error"},
		{"no node id", with(step2, EnvNodeID, ""), "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := FromEnv(env(tc.env...))
			switch {
			case tc.want == "error":
				if !errors.Is(err, ErrStep) {
					t.Fatalf("FromEnv = %+v, %v; want an ErrStep", s, err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.want == "":
				if s != nil {
					t.Fatalf("FromEnv = %+v; want nil", s)
				}
			default:
				if got := fmt.Sprintf("%+v", *s); got != tc.want {
					t.Fatalf("FromEnv = %s\nwant        %s", got, tc.want)
				}
			}
		})
	}
}

func TestPort(t *testing.T) {
	seen := map[int]string{}
	for job := uint64(1000); job < 1100; job++ {
		for step := uint64(0); step < 8; step++ {
			s := &Step{JobID: job, StepID: step}
			p := s.Port()
			if p < portBase || p+3 >= 32768 {
				t.Fatalf("step %s: port %d outside [%d, 32768)", s, p, portBase)
			}
			if other, ok := seen[p]; ok {
				t.Fatalf("steps %s and %s share port %d", s, other, p)
			}
			seen[p] = s.String()
		}
	}
}

func TestApply(t *testing.T) {
	s, err := FromEnv(env(step2...))
	if err != nil {
		t.Fatal(err)
	}
	head := *s
	head.NodeID = 0
	port := fmt.Sprint(s.Port())
	for _, tc := range []struct {
		name  string
		step  *Step
		given map[string]bool
		cfg   launcher.Config
		want  string
	}{
		{"node 1 joins node 0", s, nil, launcher.Config{}, "nodes=2:2 coord=node1:" + port + " listen=0.0.0.0:" + port + " nproc=0 run=slurm-17.0 restarts=0 rank=1"},
		{"node 0 runs it", &head, nil, launcher.Config{}, "nodes=2:2 coord= listen=0.0.0.0:" + port + " nproc=0 run=slurm-17.0 restarts=0 rank=0"},
		{"flags win", s, map[string]bool{"nnodes": true, "coordinator": true, "run-id": true, "node-rank": true},
			func() launcher.Config {
				five := 5
				c := launcher.Config{Coordinator: "10.0.0.1:1234", NodeRank: &five}
				c.Nodes, c.MinNodes, c.RunID = 3, 2, "mine"
				return c
			}(), "nodes=2:3 coord=10.0.0.1:1234 listen= nproc=0 run=mine restarts=0 rank=5"},
		{"task per GPU", &Step{JobID: 17, Nodes: []string{"a", "b"}, NodeID: 1, TasksOnNode: 4}, nil, launcher.Config{}, "nodes=2:2 coord=a:" + fmt.Sprint((&Step{JobID: 17}).Port()) + " listen=0.0.0.0:" + fmt.Sprint((&Step{JobID: 17}).Port()) + " nproc=4 run=slurm-17.0 restarts=0 rank=1"},
		{"nproc given", &Step{JobID: 17, Nodes: []string{"a"}, TasksOnNode: 4}, nil, launcher.Config{NprocPerNode: 1}, "nodes=1:1 coord= listen= nproc=1 run=slurm-17.0 restarts=0 rank=0"},
		// A requeued job's workers count on from its requeues.
		{"requeued", &Step{JobID: 17, Nodes: []string{"a"}, TasksOnNode: 1, RestartCount: 2}, nil, launcher.Config{}, "nodes=1:1 coord= listen= nproc=0 run=slurm-17.0 restarts=2 rank=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			tc.step.Apply(&cfg, tc.given)
			rank := "none" // the job's node order is the step's (SLURM_NODEID) unless --node-rank is given
			if cfg.NodeRank != nil {
				rank = fmt.Sprint(*cfg.NodeRank)
			}
			got := fmt.Sprintf("nodes=%d:%d coord=%s listen=%s nproc=%d run=%s restarts=%d rank=%s", cfg.MinNodes, cfg.Nodes, cfg.Coordinator, cfg.CoordinatorListen, cfg.NprocPerNode, cfg.RunID, cfg.RestartCountBase, rank)
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	var none *Step
	cfg := launcher.Config{}
	none.Apply(&cfg, nil)
	if cfg.Nodes != 0 || cfg.Coordinator != "" {
		t.Fatalf("a nil step changed the config: %+v", cfg)
	}
}

func TestMungeSocket(t *testing.T) {
	conf := "# x\nClusterName=c\nauthinfo = socket=/run/x/m.sock,ttl=60 # ours\n"
	read := func(p string) ([]byte, error) {
		if p == "/etc/slurm-test.conf" {
			return []byte(conf), nil
		}
		return nil, errors.New("no")
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"SLURM_CONF", "/etc/slurm-test.conf"}, "/run/x/m.sock"},
		{[]string{"SLURM_CONF", "/etc/slurm-test.conf", "GOTRAIN_MUNGE_SOCKET", "/s"}, "/s"},
		{nil, ""},
	} {
		if got := MungeSocket(env(tc.env...), read); got != tc.want {
			t.Errorf("MungeSocket(%v) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

// fakeMunge encodes "uid|restrict|payload"; a credential decodes only
// once (munged refuses replays).
type fakeMunge struct {
	uid  int
	used map[string]bool
}

func (f *fakeMunge) Encode(_ context.Context, payload string, restrict int) (string, error) {
	return fmt.Sprintf("%d|%d|%s", f.uid, restrict, payload), nil
}

func (f *fakeMunge) Decode(_ context.Context, cred string) (int, string, error) {
	var uid, restrict int
	parts := strings.SplitN(cred, "|", 3)
	if len(parts) != 3 {
		return 0, "", errors.New("bad credential")
	}
	fmt.Sscan(parts[0], &uid)
	fmt.Sscan(parts[1], &restrict)
	if restrict != f.uid {
		return 0, "", errors.New("Unauthorized credential")
	}
	if f.used[cred] {
		return 0, "", errors.New("Replayed credential")
	}
	f.used[cred] = true
	return uid, parts[2], nil
}

// TestExchange: the step's own user gets the token; another user's agent
// and another step's are refused and learn nothing.
func TestExchange(t *testing.T) {
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &fakeMunge{uid: 1000, used: map[string]bool{}}
	go Serve(ctx, ln, server, 1000, "17.0", Grant{Token: "secret-token", CAHash: "sha256:ab"}, discardLog())
	addr := ln.Addr().String()

	same := &fakeMunge{uid: 1000, used: server.used} // one munged realm: replays seen
	if g, err := Fetch(ctx, addr, same, 1000, "17.0"); err != nil || g != (Grant{"secret-token", "sha256:ab"}) {
		t.Fatalf("same user: Fetch = %+v, %v", g, err)
	}
	other := &fakeMunge{uid: 1001, used: server.used}
	g, err := Fetch(ctx, addr, other, 1001, "17.0")
	if !errors.Is(err, ErrRefused) || g.Token != "" || strings.Contains(err.Error(), "secret-token") {
		t.Fatalf("another user: Fetch = %+v, %v; want ErrRefused", g, err)
	}
	g, err = Fetch(ctx, addr, same, 1000, "17.1")
	if !errors.Is(err, ErrRefused) || g.Token != "" {
		t.Fatalf("another step: Fetch = %+v, %v; want ErrRefused", g, err)
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// 16 silent connections to the exchange port kept every
// joiner out until they timed out. Now a source keeps at most
// maxExchangePendingPerSource of them, and a joiner from another address
// gets the token at once.
func TestExchangeFloodDoesNotBlockJoiners(t *testing.T) {
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &fakeMunge{uid: 1000, used: map[string]bool{}}
	go Serve(ctx, ln, server, 1000, "17.0", Grant{Token: "secret-token"}, discardLog())
	addr := ln.Addr().String()
	conns := connguardtest.Flood(t, "127.0.0.2", addr, 100)
	fctx, cancel := context.WithTimeout(ctx, exchangeTimeout/2)
	defer cancel()
	if g, err := Fetch(fctx, addr, &fakeMunge{uid: 1000, used: server.used}, 1000, "17.0"); err != nil || g.Token != "secret-token" {
		t.Fatalf("a joiner during the flood: Fetch = %+v, %v", g, err)
	}
	open := connguardtest.StillOpen(conns, maxExchangePendingPerSource, exchangeTimeout/2)
	if open > maxExchangePendingPerSource {
		t.Errorf("%d of %d silent connections are open, want at most %d", open, len(conns), maxExchangePendingPerSource)
	}
}
