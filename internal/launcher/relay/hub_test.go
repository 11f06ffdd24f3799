package relay

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// gRPC's resolver and balancer goroutines wind down asynchronously
		// after a ClientConn closes, and grpc-go starts one global
		// callback serializer per process.
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
	)
}

// The hub tells the agent's loop of every hello (with whether the worker
// recovers in process) and every stream's end, and finds a stream by pid
// until it ends.
func TestHubAttachHooks(t *testing.T) {
	h := NewHub(slog.New(slog.DiscardHandler), nil, "node-1")
	type call struct {
		pid         int
		recoverable bool
		detached    bool
	}
	var calls []call
	h.Notify(func(pid, _ int, _ int64, rec bool) { calls = append(calls, call{pid: pid, recoverable: rec}) },
		func(pid int) { calls = append(calls, call{pid: pid, detached: true}) })
	h.Started(3, 0, 100, 0)
	w0 := h.attach(&gotrainv1.WorkerHello{Rank: 0, Pid: 100, Generation: 3})
	if h.workerByPid(100) != w0 {
		t.Fatal("workerByPid does not find the attached stream")
	}
	h.rehello(w0, &gotrainv1.WorkerHello{Rank: 0, Pid: 100, Generation: 3, Recoverable: true})
	h.detach(w0)
	if h.workerByPid(100) != nil {
		t.Error("workerByPid finds a stream that ended")
	}
	want := []call{{pid: 100}, {pid: 100, recoverable: true}, {pid: 100, detached: true}}
	if len(calls) != len(want) {
		t.Fatalf("hooks %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("hook %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}
