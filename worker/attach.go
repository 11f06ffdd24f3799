package worker

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/flight"
)

// The worker's control stream (Agent.Attach): the worker says hello, then
// sends its progress about once a second (at once after a collective fails)
// and answers the agent's requests. It is best effort: when the agent does
// not answer, training goes on without it.

const (
	// progressEvery is how often the worker looks for news to report.
	progressEvery = time.Second
	// heartbeatEvery is how often it reports even when nothing changed.
	heartbeatEvery = 5 * time.Second
	// flushTimeout bounds how long Close waits for the agent to take the
	// last report.
	flushTimeout = time.Second
)

// attachment is the worker's end of Agent.Attach.
type attachment struct {
	w      *Worker
	log    *slog.Logger
	cancel context.CancelFunc

	urgent  chan struct{}                 // a collective failed: report now
	replies chan *gotrainv1.WorkerMessage // answers to the agent's requests
	closing chan struct{}                 // Close: send the last report and end
	sent    chan struct{}                 // the sender ended
	recvd   chan struct{}                 // the receiver ended

	mu         sync.Mutex
	generation int64 // the worker's, as reported; Run's adopt changes it (recover.go)
	rank       int   // likewise: a survivor's rank may change when the job shrinks or grows
	flights    []*flight.Recorder
	comms      []comm.Comm // every communicator tracked, for abortAll
	step       int64
	sps        float64
	stepVer    uint64
}

// attach opens the control stream. Failures are logged, not returned.
func (w *Worker) attach() *attachment {
	ctx, cancel := context.WithCancel(context.Background())
	a := &attachment{
		w: w, log: w.logger, cancel: cancel, generation: w.Generation, rank: w.Rank,
		urgent:  make(chan struct{}, 1),
		replies: make(chan *gotrainv1.WorkerMessage, 4),
		closing: make(chan struct{}),
		sent:    make(chan struct{}),
		recvd:   make(chan struct{}),
	}
	stream, err := w.agent.Attach(ctx)
	if err != nil {
		a.log.Debug("attach to the agent", "err", err)
		close(a.sent)
		close(a.recvd)
		return a
	}
	go a.send(ctx, stream)
	go a.receive(stream)
	return a
}

// track records communicator c in a new flight recorder and returns the
// recording communicator.
func (a *attachment) track(name string, c comm.Comm) *flight.Comm {
	rec := flight.NewRecorder(name, flight.DefaultSize)
	if a == nil {
		return flight.Wrap(c, rec)
	}
	rec.OnFailure(func() {
		select {
		case a.urgent <- struct{}{}:
		default:
		}
	})
	a.mu.Lock()
	a.flights = append(a.flights, rec)
	a.comms = append(a.comms, c)
	a.mu.Unlock()
	return flight.Wrap(c, rec)
}

// abortAll aborts every communicator of this process: the agent said the
// generation ended and a SIGTERM follows, but a stream waiting on the GPU
// for a dead peer (an NCCL kernel, DataParallel's copy-engine flags) would
// keep the program's thread blocked in CUDA past it; the abort releases
// them, so the program sees its context end and exits. Programs in
// worker.Run recover instead (recover.go).
func (a *attachment) abortAll() {
	a.mu.Lock()
	comms := a.comms
	a.comms = nil
	a.mu.Unlock()
	if len(comms) > 0 {
		a.log.Info("the generation ended: aborting this process's communicators", "comms", len(comms))
	}
	for _, c := range comms {
		_ = comm.Abort(c)
	}
}

// progress builds the report and the version of what it reports.
func (a *attachment) progress() (*gotrainv1.RankProgress, uint64) {
	a.mu.Lock()
	flights := a.flights
	p := &gotrainv1.RankProgress{
		Rank: int32(a.rank), Generation: a.generation, Pid: int32(os.Getpid()),
		Step: a.step, SamplesPerSecond: a.sps, UnixNanos: time.Now().UnixNano(), Attached: true,
	}
	ver := a.stepVer
	a.mu.Unlock()
	for _, rec := range flights {
		s := rec.Snapshot()
		ver += s.Version
		cp := &gotrainv1.CommProgress{
			Comm: s.Comm, EnteredSeq: int64(s.Entered), CompletedSeq: int64(s.Completed),
			LastOp: s.Last.Op.String(), LastCount: s.Last.Count, LastDtype: s.Last.DType.String(),
			CompletedUnixNanos: s.CompletedAt, Error: s.Err, ErrorSeq: int64(s.ErrSeq), WaitNanos: int64(s.Wait),
			RecentFirst: int64(s.RecentFirst),
		}
		for _, w := range s.RecentWaits {
			cp.RecentWaitNanos = append(cp.RecentWaitNanos, int64(w))
		}
		if s.Entered == 0 {
			cp.LastOp, cp.LastDtype = "", ""
		}
		if s.HasPending {
			e := s.Pending
			cp.Pending = &gotrainv1.Collective{
				Seq: int64(e.Seq), Op: e.Op.String(), Dtype: e.DType.String(), Count: e.Count,
				Root: e.Peer, ReduceOp: e.ReduceName(), State: e.State.String(), EnqueuedUnixNanos: e.Enqueued,
			}
			if e.Op == flight.OpBarrier {
				cp.Pending.Dtype = ""
			}
		}
		p.Comms = append(p.Comms, cp)
	}
	return p, ver
}

func (a *attachment) send(ctx context.Context, stream gotrainv1.Agent_AttachClient) {
	defer close(a.sent)
	a.mu.Lock()
	gen, rank := a.generation, a.rank
	a.mu.Unlock()
	hello := &gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Hello{Hello: &gotrainv1.WorkerHello{
		Rank: int32(rank), Pid: int32(os.Getpid()), Generation: gen,
	}}}
	if err := stream.Send(hello); err != nil {
		a.log.Debug("attach: hello", "err", err)
		return
	}
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var lastVer uint64
	var lastSent time.Time
	report := func(force bool) error {
		p, ver := a.progress()
		if !force && ver == lastVer && time.Since(lastSent) < heartbeatEvery {
			return nil
		}
		lastVer, lastSent = ver, time.Now()
		return stream.Send(&gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Progress{Progress: p}})
	}
	if err := report(true); err != nil {
		return
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-a.closing:
			if report(true) == nil {
				_ = stream.CloseSend()
			}
			return
		case <-a.urgent:
			err = report(true)
		case <-tick.C:
			err = report(false)
		case m := <-a.replies:
			err = stream.Send(m)
		}
		if err != nil {
			a.log.Debug("attach: send", "err", err)
			return
		}
	}
}

// receive answers the agent's requests until the stream ends.
func (a *attachment) receive(stream gotrainv1.Agent_AttachClient) {
	defer close(a.recvd)
	for {
		m, err := stream.Recv()
		if err != nil {
			return
		}
		switch msg := m.GetMsg().(type) {
		case *gotrainv1.AgentMessage_DumpStacks:
			a.reply(&gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Stacks{Stacks: &gotrainv1.StackDump{
				RequestId: msg.DumpStacks.GetRequestId(), Goroutines: goroutines(),
			}}})
		case *gotrainv1.AgentMessage_Generation:
			a.w.generationChanged(msg.Generation) // recover.go
			if msg.Generation.GetEnded() != nil && !a.w.recov.enabled() {
				go a.abortAll()
			}
		default:
			a.log.Debug("attach: message not handled", "type", msg)
		}
	}
}

func (a *attachment) reply(m *gotrainv1.WorkerMessage) {
	select {
	case a.replies <- m:
	case <-a.sent:
	}
}

// goroutines returns every goroutine's stack.
func goroutines() string {
	var b bytes.Buffer
	if p := pprof.Lookup("goroutine"); p != nil {
		_ = p.WriteTo(&b, 2)
	}
	return b.String()
}

// close sends the last report and ends the stream, waiting briefly for the
// agent to take it.
func (a *attachment) close() {
	select {
	case <-a.closing:
		return
	default:
		close(a.closing)
	}
	t := time.NewTimer(flushTimeout)
	defer t.Stop()
	select {
	case <-a.recvd: // the agent ended the stream after reading everything
	case <-t.C:
	}
	a.cancel()
}

// ReportStep tells the job which training step this worker is at and its
// throughput; `gotrain diagnose` shows them. It is cheap: the value goes out
// with the next progress report.
func (w *Worker) ReportStep(step int64, samplesPerSecond float64) {
	if w.diag == nil {
		return
	}
	a := w.diag
	a.mu.Lock()
	a.step, a.sps = step, samplesPerSecond
	a.stepVer++
	a.mu.Unlock()
}

// setGeneration is what progress reports say from now on: the sender
// goroutine reads them while Run adopts a new generation.
func (a *attachment) setGeneration(g int64, rank int) {
	a.mu.Lock()
	a.generation, a.rank = g, rank
	a.mu.Unlock()
}
