package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/procstat"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Progress and evidence: the agent's half of hang diagnosis.
//
// Each worker that uses the worker library attaches (Agent.Attach) and sends
// its progress about once a second. The hub keeps the latest report of every
// local rank, and once a second sends them all, with each process's state
// from /proc/PID/stat, in ONE ReportProgress to the coordinator. Workers that
// do not attach (PyTorch) are still reported, with their process state.
//
// When the coordinator's hang detector fires, every agent gets an
// EvidenceRequest: it prints the verdict, and for the ranks named that run
// here it collects goroutine stacks (through the worker's stream), a py-spy
// dump (when py-spy is installed) or /proc files, and the GPU's state, and
// answers with ReportEvidence.

const (
	// reportEvery is how often the agent sends its ranks' progress.
	reportEvery = time.Second
	// reportTimeout bounds one ReportProgress call.
	reportTimeout = 3 * time.Second
	// stacksTimeout bounds how long a worker gets to send its stacks.
	stacksTimeout = 3 * time.Second
)

// Hub holds the latest progress of this node's ranks.
type Hub struct {
	log    *slog.Logger
	coord  gotrainv1.CoordinatorClient
	nodeID string
	tel    *observe.Telemetry     // GPU samples and step rates (observe/telemetry.go); nil: none
	ras    *observe.RASPoller     // NCCL RAS for ranks that do not attach (observe/raspoll.go); nil: none
	torch  *observe.TorchProgress // PyTorch ranks' records on gloo (observe/torchprogress.go); nil: none

	sendMu sync.Mutex // one ReportProgress at a time, in order

	mu      sync.Mutex
	gen     int64
	ranks   map[int]*rankSlot
	streams map[int]*attachedWorker // open control streams by pid
	nextReq int64
	// lastContact is when the coordinator last answered a progress report;
	// contactErr the error of a later one, nil when none failed since.
	lastContact time.Time
	contactErr  error
	// onAttach and onDetach, when set, are called (without mu) after a
	// worker said hello (again) and after its stream ended.
	onAttach func(pid, rank int, gen int64, recoverable bool)
	onDetach func(pid int)
	// recoveries are timed restarts the next report carries (AddRecovery).
	recoveries []*gotrainv1.RecoveryTiming
}

// maxPendingRecoveries bounds the timed restarts kept while the
// coordinator does not answer: the oldest go first.
const maxPendingRecoveries = 8

// AddRecovery queues a timed restart of this node (internal/launcher/recovery) for
// the next progress report, whose coordinator keeps it in its histograms.
func (h *Hub) AddRecovery(r *gotrainv1.RecoveryTiming) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recoveries = append(h.recoveries, r)
	if n := len(h.recoveries); n > maxPendingRecoveries {
		h.recoveries = slices.Clone(h.recoveries[n-maxPendingRecoveries:])
	}
}

// Notify sets what the hub calls (without its lock) after a worker said
// hello (again), and after its stream ended.
func (h *Hub) Notify(onAttach func(pid, rank int, gen int64, recoverable bool), onDetach func(pid int)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onAttach, h.onDetach = onAttach, onDetach
}

// SetTelemetry, SetRAS and SetTorch give the hub the observers whose
// annotations its reports carry (package observe); nil: none.
func (h *Hub) SetTelemetry(t *observe.Telemetry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tel = t
}

func (h *Hub) SetRAS(p *observe.RASPoller) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ras = p
}

func (h *Hub) SetTorch(tp *observe.TorchProgress) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.torch = tp
}

// Torch is the PyTorch hook's view SetTorch gave; nil: none.
func (h *Hub) Torch() *observe.TorchProgress {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.torch
}

// RAS is the NCCL RAS poller SetRAS gave; nil: none.
func (h *Hub) RAS() *observe.RASPoller {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ras
}

// Telemetry is the telemetry SetTelemetry gave; nil: none.
func (h *Hub) Telemetry() *observe.Telemetry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tel
}

// AnsweredSince says whether the coordinator answered a heartbeat after t.
func (h *Hub) AnsweredSince(t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastContact.After(t)
}

// rankSlot is one local rank of the current generation.
type rankSlot struct {
	pid      int
	gpu      int // NVML index, -1 for none
	exited   bool
	progress *gotrainv1.RankProgress // the worker's latest report; nil if none
	worker   *attachedWorker         // nil when not attached
	attached bool                    // the worker said hello at least once
	// hookStep is the last step the PyTorch hook's record reported
	// (hookSteps: it reported any), kept after the process is gone.
	hookStep  int64
	hookSteps bool
	// cpu is the process's CPU time at the last report, for its CPU use.
	cpu cpuSample
}

// attachedWorker is a worker's open Attach stream.
type attachedWorker struct {
	rank   int
	pid    int
	gen    int64
	out    chan *gotrainv1.AgentMessage
	stacks map[int64]chan string // pending stack requests, guarded by hub.mu
	// recoverable: the worker runs worker.Run (recover.go); guarded by hub.mu.
	recoverable bool
}

// NewHub returns the hub of node nodeID, which reports to coord.
func NewHub(log *slog.Logger, coord gotrainv1.CoordinatorClient, nodeID string) *Hub {
	return &Hub{log: log, coord: coord, nodeID: nodeID, ranks: map[int]*rankSlot{}, streams: map[int]*attachedWorker{}}
}

// Started records a worker of generation gen; a new generation forgets the
// old one's ranks.
func (h *Hub) Started(gen int64, rank, pid, gpu int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != h.gen {
		h.gen, h.ranks = gen, map[int]*rankSlot{}
	}
	h.ranks[rank] = &rankSlot{pid: pid, gpu: gpu}
	h.tel.Started(gen, rank)
}

// Exited records that process pid, rank's worker in generation gen, ended
// (a process that rank's slot no longer names changes nothing).
func (h *Hub) Exited(gen int64, rank, pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ranks[rank]; s != nil && gen == h.gen && s.pid == pid {
		s.exited = true
	}
}

// attach registers a worker's stream.
func (h *Hub) attach(hello *gotrainv1.WorkerHello) *attachedWorker {
	w := &attachedWorker{rank: int(hello.GetRank()), pid: int(hello.GetPid()), gen: hello.GetGeneration(),
		out: make(chan *gotrainv1.AgentMessage, 8), stacks: map[int64]chan string{}, recoverable: hello.GetRecoverable()}
	h.mu.Lock()
	if s := h.ranks[w.rank]; s != nil && h.gen == w.gen {
		s.worker, s.attached = w, true
	}
	h.streams[w.pid] = w
	notify := h.onAttach
	h.mu.Unlock()
	if notify != nil {
		notify(w.pid, w.rank, w.gen, w.recoverable)
	}
	return w
}

func (h *Hub) detach(w *attachedWorker) {
	h.mu.Lock()
	if s := h.ranks[w.rank]; s != nil && s.worker == w {
		s.worker = nil
	}
	if h.streams[w.pid] == w {
		delete(h.streams, w.pid)
	}
	for id, ch := range w.stacks {
		close(ch)
		delete(w.stacks, id)
	}
	notify := h.onDetach
	h.mu.Unlock()
	if notify != nil {
		notify(w.pid)
	}
}

func (h *Hub) progress(w *attachedWorker, p *gotrainv1.RankProgress) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ranks[w.rank]; s != nil && h.gen == w.gen && p.GetGeneration() == w.gen {
		s.progress = p
		h.tel.Observe(w.rank, p)
		if s.worker == nil && s.pid == w.pid {
			s.worker = w // it attached before the agent recorded its start
		}
	}
}

func (h *Hub) stacksArrived(w *attachedWorker, d *gotrainv1.StackDump) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch, ok := w.stacks[d.GetRequestId()]; ok {
		ch <- d.GetGoroutines() // buffered
		delete(w.stacks, d.GetRequestId())
	}
}

// Attach serves a worker's control stream; see package worker.
func (r *Server) Attach(stream gotrainv1.Agent_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "attach: the first message must be a hello")
	}
	if err := r.checkHello(stream.Context(), hello); err != nil { // claims.go
		return err
	}
	if hello.GetStandby() {
		return r.standbyAttach(stream, hello) // standby.go
	}
	if r.Hub == nil {
		return status.Error(codes.Unavailable, "attach: this agent keeps no progress")
	}
	w := r.Hub.attach(hello)
	defer r.Hub.detach(w)
	ctx := stream.Context()
	sendDone := make(chan struct{})
	defer func() { <-sendDone }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(sendDone)
		for {
			select {
			case m := <-w.out:
				if stream.Send(m) != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch msg := m.GetMsg().(type) {
		case *gotrainv1.WorkerMessage_Progress:
			r.Hub.progress(w, msg.Progress)
		case *gotrainv1.WorkerMessage_Stacks:
			r.Hub.stacksArrived(w, msg.Stacks)
		case *gotrainv1.WorkerMessage_Hello:
			r.Hub.rehello(w, msg.Hello) // recover.go
		}
	}
}

// batch builds this node's report: every rank of the current generation.
func (h *Hub) batch() *gotrainv1.ReportProgressRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	req := &gotrainv1.ReportProgressRequest{NodeId: h.nodeID, Recoveries: h.recoveries}
	h.recoveries = nil
	ranks := make([]int, 0, len(h.ranks))
	for r := range h.ranks {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	hooked := h.torch.Read(h.unattachedLocked()) // observe/torchprogress.go
	for _, r := range ranks {
		s := h.ranks[r]
		var p *gotrainv1.RankProgress
		if s.progress != nil {
			p = cloneProgress(s.progress)
		} else {
			p = &gotrainv1.RankProgress{Rank: int32(r), Generation: h.gen, Pid: int32(s.pid)}
		}
		p.Attached = s.progress != nil
		if !p.Attached {
			rec, ok := hooked[r]
			if ok {
				h.torch.Annotate(rec, p)
			}
			if !ok || !observe.HasComms(rec) {
				h.ras.Annotate(h.gen, r, p) // observe/raspoll.go
			}
			if p.GetStepSource() != "" {
				s.hookStep, s.hookSteps = p.GetStep(), true
				h.tel.Observe(r, p) // the step rate, as for an attached rank's reports
			}
		}
		h.tel.Annotate(r, p, s.gpu)
		if !s.exited {
			p.ProcessState = procState(s.pid)
			if pct, ok := s.cpu.next(s.pid, cpuTicks(s.pid), time.Now()); ok {
				p.CpuPercent = &pct
			}
		}
		req.Ranks = append(req.Ranks, p)
	}
	return req
}

// LastStep returns the last step rank of generation gen reported (through
// the worker library or the PyTorch hook), even once its process is gone;
// false when it reported none.
func (h *Hub) LastStep(gen int64, rank int) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.ranks[rank]
	switch {
	case s == nil || gen != h.gen:
		return 0, false
	case s.progress != nil:
		return s.progress.GetStep(), true
	case s.hookSteps:
		return s.hookStep, true
	}
	return 0, false
}

// unattachedLocked returns the worker pids of the ranks that run and do
// not report through the worker library, by rank.
func (h *Hub) unattachedLocked() map[int]int {
	out := map[int]int{}
	for r, s := range h.ranks {
		if s.progress == nil && !s.exited && s.pid > 0 {
			out[r] = s.pid
		}
	}
	return out
}

func cloneProgress(p *gotrainv1.RankProgress) *gotrainv1.RankProgress {
	c := &gotrainv1.RankProgress{
		Rank: p.GetRank(), Generation: p.GetGeneration(), Step: p.GetStep(), SamplesPerSecond: p.GetSamplesPerSecond(),
		UnixNanos: p.GetUnixNanos(), Pid: p.GetPid(), Comms: p.GetComms(),
	}
	return c
}

// Flush sends the ranks' progress now.
func (h *Hub) Flush(ctx context.Context) {
	h.sendMu.Lock()
	defer h.sendMu.Unlock()
	// Sent also without ranks: the coordinator takes the report as this
	// node's heartbeat (internal/coordinator/reach.go), and its answer is how the
	// agent knows it is in contact (contact.go).
	req := h.batch()
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	_, err := h.coord.ReportProgress(ctx, req)
	h.mu.Lock()
	if err == nil {
		h.lastContact, h.contactErr = time.Now(), nil
	} else if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		h.contactErr = err
	}
	if err != nil && len(req.Recoveries) > 0 {
		// Sent again with the next report (the coordinator may have
		// observed them: a histogram counts one twice rather than none).
		h.recoveries = append(req.Recoveries, h.recoveries...)
		if n := len(h.recoveries); n > maxPendingRecoveries {
			h.recoveries = slices.Clone(h.recoveries[n-maxPendingRecoveries:])
		}
	}
	h.mu.Unlock()
	if err != nil {
		h.log.Debug("report progress", "err", err)
	}
}

// Silence returns how long the coordinator has not answered this node's
// progress reports (0 while it does, or before the first answer), and the
// last error.
func (h *Hub) Silence(now time.Time) (time.Duration, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastContact.IsZero() || h.contactErr == nil {
		return 0, nil
	}
	return now.Sub(h.lastContact), h.contactErr
}

// Report sends the ranks' progress once a second until ctx ends.
func (h *Hub) Report(ctx context.Context) {
	t := time.NewTicker(reportEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Flush(ctx)
		}
	}
}

// procState returns the state letter of /proc/PID/stat ("R", "S", "D",
// "T", "Z"), "" when it cannot be read.
func procState(pid int) string {
	if f := procstat.Fields(pid); len(f) > 0 {
		return f[0]
	}
	return ""
}

// Collect gathers evidence about the requested ranks of this node.
func (h *Hub) Collect(ctx context.Context, req *gotrainv1.EvidenceRequest, logDir string) []*gotrainv1.Evidence {
	var out []*gotrainv1.Evidence
	for _, r := range req.GetRanks() {
		h.mu.Lock()
		s := h.ranks[int(r)]
		var pid, gpu int
		var w *attachedWorker
		if s != nil {
			pid, gpu, w = s.pid, s.gpu, s.worker
		}
		h.mu.Unlock()
		if s == nil {
			continue
		}
		var ev []*gotrainv1.Evidence
		add := func(kind, text string) {
			if len(text) > observe.MaxEvidenceBytes {
				text = text[:observe.MaxEvidenceBytes] + "\n... (truncated)"
			}
			ev = append(ev, &gotrainv1.Evidence{Rank: r, Pid: int32(pid), Kind: kind, Text: text})
		}
		if w != nil {
			if st, err := h.stacks(ctx, w, req.GetRequestId()); err == nil {
				add("goroutines", st)
			} else {
				add("error", fmt.Sprintf("goroutine stacks: %v", err))
			}
		} else if st, err := h.Torch().PythonStacks(ctx, pid); err == nil { // observe/pystacks.go
			add("python", st)
		} else if dump, perr := pySpy(ctx, pid); perr == nil {
			add("py-spy", dump)
		} else if !errors.Is(err, observe.ErrNoStacksHook) {
			add("error", fmt.Sprintf("Python stacks: %v", err))
		}
		add("proc", procEvidence(pid))
		if gpu >= 0 {
			if g := gpuEvidence(gpu); g != "" {
				add("gpu", g)
			}
		}
		if logDir != "" {
			writeEvidenceFile(logDir, req, r, ev)
		}
		out = append(out, ev...)
	}
	return out
}

// stacks asks an attached worker for its goroutine stacks.
func (h *Hub) stacks(ctx context.Context, w *attachedWorker, verdict int64) (string, error) {
	ch := make(chan string, 1)
	h.mu.Lock()
	h.nextReq++
	id := h.nextReq
	w.stacks[id] = ch
	h.mu.Unlock()
	select {
	case w.out <- &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_DumpStacks{DumpStacks: &gotrainv1.DumpStacksRequest{RequestId: id}}}:
	default:
		return "", errors.New("the worker's stream is full")
	}
	t := time.NewTimer(stacksTimeout)
	defer t.Stop()
	select {
	case s, ok := <-ch:
		if !ok {
			return "", errors.New("the worker detached before it answered")
		}
		return s, nil
	case <-t.C:
		h.mu.Lock()
		delete(w.stacks, id)
		h.mu.Unlock()
		return "", fmt.Errorf("no answer within %s (the process is stopped or its runtime is wedged)", stacksTimeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// pySpy dumps a Python process's stacks when py-spy is installed.
func pySpy(ctx context.Context, pid int) (string, error) {
	path, err := exec.LookPath("py-spy")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "dump", "--pid", fmt.Sprint(pid)).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("py-spy dump --pid %d: %w: %s", pid, err, out)
	}
	return string(out), nil
}

// procEvidence reads what /proc tells about a process: its state, where it
// sleeps in the kernel, and its kernel stack (root only).
func procEvidence(pid int) string {
	var b strings.Builder
	dir := fmt.Sprintf("/proc/%d", pid)
	if st, err := os.ReadFile(dir + "/status"); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if k, _, _ := strings.Cut(l, ":"); slices.Contains([]string{"Name", "State", "Threads", "VmRSS", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"}, k) {
				fmt.Fprintf(&b, "%s\n", l)
			}
		}
	} else {
		fmt.Fprintf(&b, "%s/status: %v\n", dir, err)
	}
	if wc, err := os.ReadFile(dir + "/wchan"); err == nil {
		fmt.Fprintf(&b, "wchan: %s\n", strings.TrimSpace(string(wc)))
	}
	if ks, err := os.ReadFile(dir + "/stack"); err == nil && len(ks) > 0 {
		fmt.Fprintf(&b, "kernel stack:\n%s", ks)
	}
	return b.String()
}

// gpuEvidence samples a GPU through NVML; "" without NVML.
func gpuEvidence(gpu int) string {
	nv, err := gpuinfo.Open()
	if err != nil {
		return ""
	}
	defer nv.Close()
	s, err := nv.Sample(gpu)
	if err != nil {
		return fmt.Sprintf("GPU %d: %v", gpu, err)
	}
	return fmt.Sprintf("GPU %d: utilization %d%%, memory %d of %d MiB, %.0f W of %.0f W, %d °C, SM clock %d MHz, throttle %s, ECC uncorrected %d",
		gpu, s.GPUUtil, s.MemoryUsed>>20, s.MemoryTotal>>20, s.PowerW, s.PowerLimitW, s.TempC, s.SMClockMHz, s.Throttle, s.ECCUncorrected)
}

// writeEvidenceFile keeps a rank's evidence in the log dir.
func writeEvidenceFile(dir string, req *gotrainv1.EvidenceRequest, rank int32, ev []*gotrainv1.Evidence) {
	var b strings.Builder
	fmt.Fprintf(&b, "hang verdict %d (generation %d): %s\n", req.GetRequestId(), req.GetGeneration(), req.GetVerdict().GetSummary())
	for _, e := range ev {
		fmt.Fprintf(&b, "\n=== %s (rank %d, pid %d)\n%s\n", e.GetKind(), e.GetRank(), e.GetPid(), e.GetText())
	}
	name := filepath.Join(dir, fmt.Sprintf("hang-gen%d-verdict%d-rank%d.txt", req.GetGeneration(), req.GetRequestId(), rank))
	// Its user's alone (0600), like the rank logs beside it, and never
	// written through a link planted in the log dir.
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return
	}
	_, _ = f.WriteString(b.String())
	_ = f.Close()
}

var _ observe.RASSource = (*Hub)(nil)

// RASRanks lists the local ranks of the current generation for the NCCL
// RAS poller (observe/raspoll.go).
func (h *Hub) RASRanks() (int64, []observe.RASRank) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]observe.RASRank, 0, len(h.ranks))
	for r, s := range h.ranks {
		out = append(out, observe.RASRank{Rank: r, Pid: s.pid, GPU: s.gpu, Attached: s.progress != nil || s.worker != nil, Exited: s.exited})
	}
	slices.SortFunc(out, func(a, b observe.RASRank) int { return a.Rank - b.Rank })
	return h.gen, out
}

// RankOfGPU returns the rank of the current generation that uses GPU gpu.
func (h *Hub) RankOfGPU(gpu int) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	best, found := 0, false
	for r, s := range h.ranks {
		if s.gpu == gpu && (!found || r < best) {
			best, found = r, true
		}
	}
	return best, found
}

// UsedGPUs returns the GPUs the current generation's ranks use, ascending.
func (h *Hub) UsedGPUs() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for _, s := range h.ranks {
		if s.gpu >= 0 && !slices.Contains(out, s.gpu) {
			out = append(out, s.gpu)
		}
	}
	slices.Sort(out)
	return out
}
