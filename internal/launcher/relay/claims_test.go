package relay

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// claimsServer serves the relay's Attach on a unix socket, as the agent
// does, checking hellos against c; it returns a client.
func claimsServer(t *testing.T, c *Claims, h *Hub) gotrainv1.AgentClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(peerCredentials{}))
	gotrainv1.RegisterAgentServer(srv, &Server{Hub: h, Claims: c, Log: slog.New(slog.DiscardHandler)})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); srv.Stop(); <-done })
	return gotrainv1.NewAgentClient(cc)
}

// Attach trusted the rank, pid and standby slot a hello
// claims, so any process holding the token could take another rank's or
// process's place (its stack dumps, its park and resume messages) or a
// standby's slot. Now a hello must come from the pid it names, and that pid
// must be the process the agent started as that rank of that generation,
// or as the standby of that slot.
func TestAttachClaimsCheckedAgainstWhatTheAgentStarted(t *testing.T) {
	self := os.Getpid()
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	otherPid := other.Process.Pid

	asRank1Gen2 := map[int]Proc{self: {Rank: 1, Gen: 2}, otherPid: {Rank: 0, Gen: 2}}
	asStandby1 := map[int]Proc{self: {Standby: true, Slot: 1}, otherPid: {Standby: true, Slot: 0}}
	for _, tc := range []struct {
		name    string
		started map[int]Proc
		hello   *gotrainv1.WorkerHello
		refused string // "" for accepted
	}{
		{"its own rank", asRank1Gen2, &gotrainv1.WorkerHello{Rank: 1, Pid: int32(self), Generation: 2}, ""},
		{"another rank", asRank1Gen2, &gotrainv1.WorkerHello{Rank: 0, Pid: int32(self), Generation: 2}, "claims rank 0 of generation 2 but is rank 1 of generation 2"},
		{"another generation", asRank1Gen2, &gotrainv1.WorkerHello{Rank: 1, Pid: int32(self), Generation: 1}, "claims rank 1 of generation 1"},
		{"another process's pid", asRank1Gen2, &gotrainv1.WorkerHello{Rank: 0, Pid: int32(otherPid), Generation: 2}, "comes from pid " + strconv.Itoa(self)},
		{"a pid the agent never started", map[int]Proc{}, &gotrainv1.WorkerHello{Rank: 0, Pid: int32(self), Generation: 0}, "is no worker or standby of this agent"},
		{"no pid", asRank1Gen2, &gotrainv1.WorkerHello{Rank: 1, Pid: 0, Generation: 2}, "comes from pid"},
		{"a standby's slot as a rank", asRank1Gen2, &gotrainv1.WorkerHello{Rank: -1, Pid: int32(self), Generation: -1, Standby: true, StandbySlot: 1}, "claims the standby of slot 1 but is rank 1"},
		{"another standby's slot", asStandby1, &gotrainv1.WorkerHello{Rank: -1, Pid: int32(self), Generation: -1, Standby: true, StandbySlot: 0}, "claims the standby of slot 0 but is the standby of slot 1"},
		{"a rank as a standby", asStandby1, &gotrainv1.WorkerHello{Rank: 1, Pid: int32(self), Generation: 2}, "but is the standby of slot 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClaims()
			c.wait = 50 * time.Millisecond
			for pid, p := range tc.started {
				c.Set(pid, p)
			}
			h := NewHub(slog.New(slog.DiscardHandler), nil, "node")
			client := claimsServer(t, c, h)
			// Bounded: an accepted hello gets no answer to Recv.
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			stream, err := client.Attach(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Hello{Hello: tc.hello}}); err != nil {
				t.Fatal(err)
			}
			if tc.refused == "" {
				testkit.WaitFor(t, time.Minute, "the stream attached", func() bool { return h.workerByPid(self) != nil })
				_ = stream.CloseSend()
				return
			}
			_, err = stream.Recv()
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("Recv = %v; want PermissionDenied saying %q", err, tc.refused)
			}
			if w := h.workerByPid(int(tc.hello.GetPid())); w != nil {
				t.Errorf("the refused hello was attached as rank %d", w.rank)
			}
		})
	}
}

// A worker run by a wrapper that forks it (sh -c 'prog', python -m ...) is
// in the process group of the process the agent started: its hello counts
// as that process's.
func TestClaimsOfAProcessInAStartedGroup(t *testing.T) {
	sh := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL); _ = sh.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(line))
	c := NewClaims()
	c.wait = 50 * time.Millisecond
	c.Set(sh.Process.Pid, Proc{Rank: 3, Gen: 1})
	if p, err := c.check(t.Context(), &gotrainv1.WorkerHello{Rank: 3, Pid: int32(child), Generation: 1}, child); err != nil || p.Rank != 3 {
		t.Errorf("the wrapper's child: %v, %v", p, err)
	}
	if _, err := c.check(t.Context(), &gotrainv1.WorkerHello{Rank: 2, Pid: int32(child), Generation: 1}, child); err == nil {
		t.Error("the wrapper's child took rank 2")
	}
	c.Forget(sh.Process.Pid)
	if _, err := c.check(t.Context(), &gotrainv1.WorkerHello{Rank: 3, Pid: int32(child), Generation: 1}, child); err == nil {
		t.Error("a forgotten process's group still counts")
	}
}

// Only the process the agent started as a rank may keep that rank's
// snapshots: not another rank's worker, not a standby, not a stranger.
func TestAuthorizeSnapshots(t *testing.T) {
	c := NewClaims()
	c.wait = 10 * time.Millisecond
	c.Set(100, Proc{Rank: 2, Gen: 1})
	c.Set(200, Proc{Standby: true, Slot: 0})
	ctx := context.Background()
	if err := c.AuthorizeSnapshots(ctx, 100, 2); err != nil {
		t.Errorf("rank 2's own worker: %v", err)
	}
	for _, tc := range []struct {
		pid, rank int
		want      string
	}{{100, 3, "rank 2"}, {200, 0, "standby"}, {999999, 2, "no worker"}} {
		if err := c.AuthorizeSnapshots(ctx, tc.pid, tc.rank); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pid %d as rank %d: %v, want a refusal naming %q", tc.pid, tc.rank, err, tc.want)
		}
	}
}
