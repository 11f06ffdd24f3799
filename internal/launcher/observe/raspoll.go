package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gotrain/gotrain/internal/procstat"

	"github.com/gotrain/gotrain/internal/ncclras"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Collective-level progress of workers that do not attach (PyTorch).
//
// On an NCCL job, a local rank that has not attached rasAfter after it
// started is read from NCCL's RAS service on this node: every rasEvery the
// poller asks RAS for the job's communicators (JSON, or text where NCCL has
// no JSON), a ncclras.Tracker turns the launch counts into entered /
// completed / pending per rank, and the relay's Hub.batch puts them into the rank's
// RankProgress (comms_source "nccl-ras"), so the coordinator's detector
// judges them like any other rank.
//
// Each agent polls its own node's RAS and reports only its own ranks: RAS
// reports the whole job from any node, and a RAS rank is matched to a
// gotrain rank by process id (the worker or a descendant of it) or, where
// the pids do not match (another pid namespace), by NVML GPU index on an
// address of this node. So every gotrain rank is reported by exactly one
// agent, and no agent needs another node's pids. Only communicators that
// span the job (size = world size) are reported: the detector expects every
// rank in every communicator it watches.
//
// Where RAS does not answer for rasUnreachableAfter (NCCL before 2.24,
// NCCL_RAS_ENABLE=0, NCCL not initialized yet) the agent logs it once and
// reports comms_note, which `gotrain diagnose` prints.

const (
	// rasEvery is how often the poller reads RAS.
	rasEvery = 2 * time.Second
	// rasAfter is how long a rank may run without attaching before RAS is
	// read for it.
	rasAfter = 5 * time.Second
	// rasUnreachableAfter is how long RAS may not answer before the agent
	// says it has no collective-level view (PyTorch initializes NCCL at the
	// first collective, after imports and model setup).
	rasUnreachableAfter = 30 * time.Second
	// rasQueryTimeout bounds one query; RAS itself waits rasCollTimeout for
	// the other processes' answers.
	rasQueryTimeout = 5 * time.Second
	rasCollTimeout  = 2 * time.Second
)

// MaxEvidenceBytes bounds one piece of a hang's evidence.
const MaxEvidenceBytes = 256 << 10

// CommsSourceRAS marks progress derived from NCCL RAS reports.
const CommsSourceRAS = "nccl-ras"

// rasQuery is ncclras.Query; tests replace it only through RASPoller.query.
type rasQuery func(ctx context.Context, addr string, o ncclras.Options) (*ncclras.Report, error)

// RASPoller reads NCCL RAS for the local ranks that do not attach.
type RASPoller struct {
	addr  string
	log   *slog.Logger
	src   RASSource
	query rasQuery
	now   func() time.Time
	// parents returns a process's parent pid, 0 when unknown.
	parents func(pid int) int
	// local reports whether host is an address of this node.
	local func(host string) bool

	mu       sync.Mutex
	gen      int64
	world    int
	first    map[int]time.Time // rank -> when first seen running unattached
	results  map[int][]*gotrainv1.CommProgress
	polledAt time.Time
	note     string       // why there is no view; "" when RAS answers
	noteFor  map[int]bool // the ranks note is for
	tracker  *ncclras.Tracker
	text     bool      // RAS refused JSON
	failing  time.Time // since when RAS has not answered; zero when it does
	warned   bool
}

// RASRank is a local rank as the poller needs it.
type RASRank struct {
	Rank, Pid, GPU   int
	Attached, Exited bool
}

// RASSource lists the local ranks of the current generation.
type RASSource interface {
	RASRanks() (gen int64, ranks []RASRank)
}

// RASAddr is where NCCL's RAS service listens for the workers' environment
// env: its NCCL_RAS_ADDR, else NCCL's default.
func RASAddr(env []string) string {
	addr := ncclras.DefaultAddr
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "NCCL_RAS_ADDR="); ok && v != "" {
			addr = v
		}
	}
	return addr
}

func NewRASPoller(log *slog.Logger, src RASSource, env []string) *RASPoller {
	return &RASPoller{addr: RASAddr(env), log: log, src: src, query: ncclras.Query, now: time.Now,
		parents: parentPid, local: isLocalAddr, tracker: ncclras.NewTracker(),
		first: map[int]time.Time{}, results: map[int][]*gotrainv1.CommProgress{}}
}

// Generation tells the poller the world size of generation gen.
func (p *RASPoller) Generation(gen int64, world int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.world = world
	p.resetLocked(gen)
}

func (p *RASPoller) resetLocked(gen int64) {
	if gen == p.gen && p.first != nil {
		return
	}
	p.gen = gen
	p.first, p.results, p.noteFor = map[int]time.Time{}, map[int][]*gotrainv1.CommProgress{}, nil
	p.tracker = ncclras.NewTracker()
}

// Run reads RAS every rasEvery until ctx ends.
func (p *RASPoller) Run(ctx context.Context) { p.run(ctx, rasEvery) }

func (p *RASPoller) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.poll(ctx)
		}
	}
}

// poll reads RAS once if a local rank needs it.
func (p *RASPoller) poll(ctx context.Context) {
	now := p.now()
	gen, ranks := p.src.RASRanks()
	p.mu.Lock()
	p.resetLocked(gen)
	var want []RASRank
	for _, r := range ranks {
		if r.Attached || r.Exited {
			delete(p.first, r.Rank)
			continue
		}
		if _, ok := p.first[r.Rank]; !ok {
			p.first[r.Rank] = now
		}
		if now.Sub(p.first[r.Rank]) >= rasAfter {
			want = append(want, r)
		}
	}
	world := p.world
	if len(want) == 0 {
		p.results, p.note, p.noteFor, p.failing = map[int][]*gotrainv1.CommProgress{}, "", nil, time.Time{}
		p.mu.Unlock()
		return
	}
	text := p.text
	p.mu.Unlock()

	st, text, err := p.read(ctx, text)

	p.mu.Lock()
	defer p.mu.Unlock()
	p.text = text
	if gen != p.gen {
		return // a new generation started meanwhile
	}
	if err != nil {
		if p.failing.IsZero() {
			p.failing = now
		}
		p.results = map[int][]*gotrainv1.CommProgress{}
		if now.Sub(p.failing) >= rasUnreachableAfter {
			p.note = fmt.Sprintf("not a gotrain worker and NCCL RAS unreachable at %s", p.addr)
			p.noteFor = map[int]bool{}
			var rs []string
			for _, r := range want {
				p.noteFor[r.Rank] = true
				rs = append(rs, strconv.Itoa(r.Rank))
			}
			if !p.warned {
				p.warned = true
				p.log.Warn("no collective-level view: hangs of these ranks are judged by their process state only (NCCL 2.24+ with NCCL_RAS_ENABLE=1 serves RAS)",
					"ranks", strings.Join(rs, ","), "reason", p.note, "err", err)
			}
		}
		return
	}
	if p.warned && p.note != "" {
		p.log.Info("NCCL RAS answers now", "addr", p.addr)
	}
	p.failing, p.note, p.noteFor = time.Time{}, "", nil
	p.polledAt = now
	p.results = p.mapViews(p.tracker.Update(now, st), want, world)
}

// read queries RAS: JSON unless it refused JSON before (text says so).
func (p *RASPoller) read(ctx context.Context, text bool) (*ncclras.Status, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, rasQueryTimeout)
	defer cancel()
	if !text {
		rep, err := p.query(ctx, p.addr, ncclras.Options{Format: "json", Timeout: rasCollTimeout})
		if err == nil {
			st, err := ncclras.ParseJSON([]byte(rep.Raw))
			return st, false, err
		}
		if !errors.Is(err, ncclras.ErrNoJSON) {
			return nil, false, err
		}
		p.log.Info("NCCL RAS has no JSON format; reading its text report", "addr", p.addr)
		text = true
	}
	rep, err := p.query(ctx, p.addr, ncclras.Options{Timeout: rasCollTimeout})
	if err != nil {
		return nil, text, err
	}
	return ncclras.ParseText(rep.Raw), text, nil
}

// mapViews assigns the communicators' ranks to the local ranks in want.
func (p *RASPoller) mapViews(views []ncclras.CommView, want []RASRank, world int) map[int][]*gotrainv1.CommProgress {
	out := map[int][]*gotrainv1.CommProgress{}
	for _, v := range views {
		if v.Unknown || world <= 0 || v.Size != world {
			continue
		}
		matched := map[int]bool{}
		var others *ncclras.RankView
		for i := range v.Ranks {
			rv := &v.Ranks[i]
			if rv.Rank.Rank < 0 {
				others = rv
				continue
			}
			if r, ok := p.match(rv.Rank, want); ok && !matched[r] {
				matched[r] = true
				out[r] = append(out[r], rasCommProgress(v.Hash, *rv))
			}
		}
		if others == nil {
			continue
		}
		// The ranks the text report does not name: every local rank of a
		// communicator that spans the job is in it.
		for _, w := range want {
			if !matched[w.Rank] {
				out[w.Rank] = append(out[w.Rank], rasCommProgress(v.Hash, *others))
			}
		}
	}
	return out
}

// match finds the local rank a RAS rank is: its pid is the worker's or a
// descendant's; else its GPU on an address of this node.
func (p *RASPoller) match(id ncclras.Rank, want []RASRank) (int, bool) {
	if id.Pid > 0 {
		for pid, hops := id.Pid, 0; pid > 1 && hops < 8; pid, hops = p.parents(pid), hops+1 {
			for _, w := range want {
				if w.Pid == pid {
					return w.Rank, true
				}
			}
		}
	}
	if id.NvmlDev < 0 || id.Host == "" || !p.local(id.Host) {
		return 0, false
	}
	found, n := 0, 0
	for _, w := range want {
		if w.GPU == id.NvmlDev {
			found, n = w.Rank, n+1
		}
	}
	return found, n == 1
}

// rasCommProgress is a RAS rank's progress as the agent reports it.
func rasCommProgress(hash string, rv ncclras.RankView) *gotrainv1.CommProgress {
	c := &gotrainv1.CommProgress{Comm: hash, EnteredSeq: rv.Entered, CompletedSeq: rv.Completed, Error: rv.Error}
	if !rv.CompletedAt.IsZero() {
		c.CompletedUnixNanos = rv.CompletedAt.UnixNano()
	}
	if rv.Error != "" {
		c.ErrorSeq = rv.Completed + 1
	}
	// A pending collective whose function the counts do not tell is left
	// out: the detector counts the rank as waiting without voting on what
	// the job is at.
	if rv.Pending && !rv.Ambiguous && (rv.PendingOp != "" || rv.Error != "") {
		c.Pending = &gotrainv1.Collective{Seq: rv.Completed + 1, Op: rv.PendingOp, Root: -1, State: "enqueued"}
		if rv.Error != "" {
			c.Pending.State = "failed"
		}
		if !rv.PendingSince.IsZero() {
			c.Pending.EnqueuedUnixNanos = rv.PendingSince.UnixNano()
		}
	}
	return c
}

// Annotate adds what RAS says about an unattached rank to its report.
// Called by the relay's Hub.batch with the hub's lock held.
func (p *RASPoller) Annotate(gen int64, rank int, rp *gotrainv1.RankProgress) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen != p.gen {
		return
	}
	if cs, ok := p.results[rank]; ok {
		rp.Comms = cs // never modified after the poll made them
		rp.CommsSource = CommsSourceRAS
		rp.UnixNanos = p.polledAt.UnixNano()
		return
	}
	if p.noteFor[rank] {
		rp.CommsNote = p.note
	}
}

// parentPid reads a process's parent from /proc/PID/stat; 0 when unknown.
func parentPid(pid int) int {
	f := procstat.Fields(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// isLocalAddr reports whether host is an address of this machine.
func isLocalAddr(host string) bool {
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// RASEvidence asks NCCL's RAS service on this node how NCCL sees the job:
// dead or missing ranks, communicators whose ranks disagree, errors.
func RASEvidence(ctx context.Context, rank int32, env []string) *gotrainv1.Evidence {
	addr := RASAddr(env)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev := &gotrainv1.Evidence{Rank: rank, Kind: "nccl-ras"}
	rep, err := ncclras.Query(ctx, addr, ncclras.Options{Timeout: 5 * time.Second})
	if err != nil {
		ev.Kind, ev.Text = "error", fmt.Sprintf("NCCL RAS: %v", err)
		return ev
	}
	ev.Text = rep.Raw
	if len(rep.Problems) > 0 {
		ev.Text = "problems NCCL reports:\n  " + strings.Join(rep.Problems, "\n  ") + "\n\n" + rep.Raw
	}
	if len(ev.Text) > MaxEvidenceBytes {
		ev.Text = ev.Text[:MaxEvidenceBytes] + "\n... (truncated)"
	}
	return ev
}
