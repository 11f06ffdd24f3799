package relay

import (
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Hot standbys (gotrain launch --standby), the shell's half: the machine
// (internal/launcher/agentcore) keeps the pool and decides; package worker has the
// standby's side (worker/standby.go).
//
// Once a generation runs, the agent starts per local slot one spare process
// of the worker program, bound to the slot's GPU (found in the node's
// CUDA_VISIBLE_DEVICES list), with GOTRAIN_STANDBY=1 and the job-wide
// variables but no rank. Its worker.Init prewarms the GPU, attaches with
// hello{standby} and waits. When a later generation needs a new process for
// a rank, the agent hands the rank to the slot's ready standby over its
// stream (StandbyAssignment: the generation and the rank, from which the
// worker builds its identity as the agent would) instead of starting a
// process, and starts a new standby for next time. From then on the process
// is that rank's worker: its output is "[rank R]" (it was "[standby N]"),
// its log file rankR.log (the lines it printed before are written there
// first), and its exit is that rank's. An unassigned standby's exit is
// logged and it is replaced; it never fails the job. Unassigned standbys are
// SIGKILLed (whole process group) when the job ends or is stopped.
//
// The program must use package worker: a standby that exits, or stays
// silent for --standby-timeout, without saying hello turns standbys off
// with one warning, and ranks start new processes as without --standby.
//
// A standby holds about its rank's RSS. Under --standby auto the machine
// asks for the node's memory before the first standbys start, once the
// ranks run (MeasureMemory), and keeps none, with one warning, when their
// RSS once more does not fit in MemAvailable with room to spare.

// Standbys are the open streams of standbys, by pid: the relay's Attach
// handlers register them and wait for the machine's verdict on the hello;
// the agent's loop answers and sends assignments through them.
type Standbys struct {
	mu      sync.Mutex
	links   map[int]*standbyLink
	streams uint64 // the last stream number given out
}

type standbyLink struct {
	stream  uint64                       // its number, for the machine
	verdict chan error                   // the machine's answer to the hello
	send    chan *gotrainv1.AgentMessage // the assignment
}

// NewStandbys returns a table of no standby.
func NewStandbys() *Standbys { return &Standbys{links: map[int]*standbyLink{}} }

func (l *Standbys) add(pid int) *standbyLink {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streams++
	sl := &standbyLink{stream: l.streams, verdict: make(chan error, 1), send: make(chan *gotrainv1.AgentMessage, 1)}
	l.links[pid] = sl
	return sl
}

// Next numbers a stream that is no gRPC stream (a Python standby's socket).
func (l *Standbys) Next() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streams++
	return l.streams
}

func (l *Standbys) remove(pid int, sl *standbyLink) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.links[pid] == sl {
		delete(l.links, pid)
	}
}

func (l *Standbys) get(pid int) *standbyLink {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.links[pid]
}

// Verdict answers pid's hello.
func (l *Standbys) Verdict(pid int, err error) {
	if sl := l.get(pid); sl != nil {
		select {
		case sl.verdict <- err:
		default:
		}
	}
}

// Send hands m to pid's stream; false when it has none or it is full.
func (l *Standbys) Send(pid int, m *gotrainv1.AgentMessage) bool {
	sl := l.get(pid)
	if sl == nil {
		return false
	}
	select {
	case sl.send <- m:
		return true
	default:
		return false
	}
}

// standbyAttach serves a standby's Attach stream: the machine makes the
// standby ready (or refuses it), and the stream carries its assignment
// when a rank takes it.
func (r *Server) standbyAttach(stream gotrainv1.Agent_AttachServer, hello *gotrainv1.WorkerHello) error {
	slot, pid := int(hello.GetStandbySlot()), int(hello.GetPid())
	sl := r.Standbys.add(pid)
	defer r.Standbys.remove(pid, sl)
	ctx := stream.Context()
	r.Post(agentcore.StandbyHello{Slot: slot, Pid: pid, Stream: sl.stream})
	select {
	case err := <-sl.verdict:
		if err != nil {
			return status.Errorf(codes.FailedPrecondition, "attach: %v", err)
		}
	case <-ctx.Done():
		return ctx.Err()
	case <-r.LoopDone:
		return status.Error(codes.Unavailable, "attach: the agent is stopping")
	}
	recvErr := make(chan error, 1)
	go func() { // ends when the stream does (Attach returning ends it)
		for {
			if _, err := stream.Recv(); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	select {
	case m := <-sl.send:
		if err := stream.Send(m); err != nil {
			return err
		}
		// The worker closes its end once it has the assignment.
		select {
		case <-recvErr:
		case <-ctx.Done():
		}
		return nil
	case err := <-recvErr:
		r.Post(agentcore.StandbyDetached{Slot: slot, Pid: pid, Stream: sl.stream})
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-ctx.Done():
		r.Post(agentcore.StandbyDetached{Slot: slot, Pid: pid, Stream: sl.stream})
		return ctx.Err()
	}
}
