package job

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Errors returned by New and Step. An event that returns an error leaves the
// machine unchanged.
var (
	ErrInvalidConfig = errors.New("job: invalid config")
	// ErrInvalidEvent: the event is malformed or contradicts the job (a rank
	// that does not run on the node, a generation that has not started).
	ErrInvalidEvent = errors.New("job: invalid event")
	// ErrDuplicateNode: the node id, or the agent (hostname and pid), joined
	// already.
	ErrDuplicateNode = errors.New("job: node already joined")
	// ErrUnknownNode: no node with this id is part of the job.
	ErrUnknownNode = errors.New("job: unknown node")
	// ErrJobStarted: a node tried to join after the first generation started.
	ErrJobStarted = errors.New("job: job already started")
	// ErrJobFinished: a node tried to join a finished job.
	ErrJobFinished = errors.New("job: job is finished")
	// ErrPreflightFailed: a node that failed its preflight checks tried
	// to join a job that goes on without it (preflight.go).
	ErrPreflightFailed = errors.New("job: node failed its preflight checks")
)

// Config configures a Machine.
type Config struct {
	// RunID names the job run; required.
	RunID string
	// Nodes is how many nodes the job runs on at most (--nnodes MAX);
	// default 1. It starts at once when that many have joined.
	Nodes int
	// MinNodes is how many nodes it needs at least (--nnodes MIN:MAX);
	// default Nodes. With fewer than Nodes but at least MinNodes joined,
	// the first generation starts JoinSettle after the last join; a lost
	// node is followed by a generation on the survivors while MinNodes
	// remain; a node that joins a running job with fewer than Nodes is
	// admitted at a new generation (membership.go).
	MinNodes int
	// NodeTimeout is how long a node may be unreachable (its watch stream
	// broke, gossip finds it silent) before it is lost: a blip shorter than
	// this changes nothing. 0: DefaultNodeTimeout.
	NodeTimeout time.Duration
	// JoinSettle is how long the machine waits after a join before it
	// acts on it (starts the first generation with MinNodes or more, or
	// grows a running job), so that a burst of joins is one generation.
	// 0: DefaultJoinSettle.
	JoinSettle time.Duration
	// MaxRestarts is how many times a failed generation is restarted; default 0.
	MaxRestarts int
	// RestartCountBase is added to the restart count the machine reports
	// (StartGeneration, Status): the restarts of earlier runs of the same
	// job, such as a Slurm job's requeues (SLURM_RESTART_COUNT), so that
	// workers see one count across them. It does not count toward MaxRestarts.
	RestartCountBase int
	// RestartBackoff is how long the machine waits, once every rank of a
	// failed generation is accounted for, before it starts the next one; the
	// first Tick after it starts it. 0 restarts at once.
	RestartBackoff time.Duration
	// HangTimeout is how long a communicator's lowest completed collective
	// may stand still while work is pending before the hang detector fires
	// (hang_detect.go). 0 (the default): adaptive, max(3 x the
	// communicator's p99 interval between completions, 1s), warm-up left
	// out (package internal/coordinator/rhythm); DefaultHangTimeout until the
	// rhythm has enough intervals.
	HangTimeout time.Duration
	// OnHang is OnHangReport (default) or OnHangRestart.
	OnHang string
	// OnStraggler is OnStragglerReport (default: a straggler verdict is a
	// finding only) or OnStragglerReplace (straggler_replace.go).
	OnStraggler string
	// StragglerPersist is how long a straggler verdict must stand before
	// OnStragglerReplace acts on it; 0: DefaultStragglerPersist.
	StragglerPersist time.Duration
	// StragglerCooldown is how long after a replacement a straggler on the
	// same rank or host is only reported (replacing did not help: the cause
	// is likely its GPU or host); 0: DefaultStragglerCooldown.
	StragglerCooldown time.Duration
	// Attach: the caller tells the machine when a node's agent attaches
	// (its first NodeReachable: its watch stream opened). A node then
	// counts for the job only once attached, and one that does not attach
	// within NodeTimeout of its join is dropped (membership.go). False: a
	// node counts from its join (callers that do not watch streams).
	Attach bool
	// RendezvousTimeout is how long the job waits for all its nodes to
	// join, counted from the first event the machine sees; the first Tick
	// after it fails the job, naming the nodes that joined. 0 waits forever.
	RendezvousTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	c.MinNodes = cmp.Or(c.MinNodes, c.Nodes)
	c.NodeTimeout = cmp.Or(c.NodeTimeout, DefaultNodeTimeout)
	c.JoinSettle = cmp.Or(c.JoinSettle, DefaultJoinSettle)
	c.OnHang = cmp.Or(c.OnHang, OnHangReport)
	c.OnStraggler = cmp.Or(c.OnStraggler, OnStragglerReport)
	c.StragglerPersist = cmp.Or(c.StragglerPersist, DefaultStragglerPersist)
	c.StragglerCooldown = cmp.Or(c.StragglerCooldown, DefaultStragglerCooldown)
	return c
}

func (c Config) validate() error {
	switch {
	case c.RunID == "":
		return fmt.Errorf("%w: run id is empty: give the job a run id", ErrInvalidConfig)
	case c.Nodes < 1:
		return fmt.Errorf("%w: nodes is %d: a job needs at least one node", ErrInvalidConfig, c.Nodes)
	case c.MinNodes < 1 || c.MinNodes > c.Nodes:
		return fmt.Errorf("%w: nodes %d:%d: the minimum must be at least 1 and at most the maximum", ErrInvalidConfig, c.MinNodes, c.Nodes)
	case c.NodeTimeout < 0 || c.JoinSettle < 0:
		return fmt.Errorf("%w: node timeout %s, join settle %s: use positive durations", ErrInvalidConfig, c.NodeTimeout, c.JoinSettle)
	case c.MaxRestarts < 0:
		return fmt.Errorf("%w: max restarts is %d: use 0 or more", ErrInvalidConfig, c.MaxRestarts)
	case c.RestartCountBase < 0:
		return fmt.Errorf("%w: restart count base is %d: use 0 or more", ErrInvalidConfig, c.RestartCountBase)
	case c.RestartBackoff < 0:
		return fmt.Errorf("%w: restart backoff is %s: use 0 or more", ErrInvalidConfig, c.RestartBackoff)
	case c.RendezvousTimeout < 0:
		return fmt.Errorf("%w: rendezvous timeout is %s: use 0 (wait forever) or more", ErrInvalidConfig, c.RendezvousTimeout)
	case c.HangTimeout < 0:
		return fmt.Errorf("%w: hang timeout %s: use a positive duration, or 0 for the adaptive timeout", ErrInvalidConfig, c.HangTimeout)
	case c.OnHang != OnHangReport && c.OnHang != OnHangRestart:
		return fmt.Errorf("%w: on hang is %q: use %q or %q", ErrInvalidConfig, c.OnHang, OnHangReport, OnHangRestart)
	case c.OnStraggler != OnStragglerReport && c.OnStraggler != OnStragglerReplace:
		return fmt.Errorf("%w: on straggler is %q: use %q or %q", ErrInvalidConfig, c.OnStraggler, OnStragglerReport, OnStragglerReplace)
	case c.StragglerPersist < 0 || c.StragglerCooldown < 0:
		return fmt.Errorf("%w: straggler persist %s, cool-down %s: use positive durations", ErrInvalidConfig, c.StragglerPersist, c.StragglerCooldown)
	}
	return nil
}

// Machine is the job state machine. It is not safe for concurrent use; the
// caller serializes calls.
type Machine struct {
	cfg   Config
	state State
	nodes map[string]*node // nodes present now

	gen      int64 // current generation, -1 before the first
	restarts int
	ranks    []rank // ranks of the current generation, by rank

	failure *Failure // root cause of the latest ended generation
	reason  string   // failure in words

	barriers map[string]*barrier // pending barriers of the current generation
	released map[string]bool     // barriers of the current generation already released
	waiters  map[uint64]string   // waiting call -> barrier name

	now            time.Time // the time of the event being stepped
	waitingSince   time.Time // the first event's time: the rendezvous clock starts
	pendingRestart bool      // the next generation starts at restartAt
	restartAt      time.Time

	hang hangState // the hang detector (hang_detect.go)

	repeats repeats // failures that repeat before any progress (restart.go)

	members  membership // joins to act on and a growth under way (membership.go)
	straggle straggle   // replacing persistent stragglers (straggler_replace.go)
	joins    int        // joins so far: the next node's seq (order.go)
}

type node struct {
	id        string
	info      NodeInfo
	groupRank int // in the current generation; -1 before the first, or when it joined since
	// Its place in the admission order (order.go): the host first, then by
	// node rank (-1: none given), then by seq (join order).
	host     bool
	nodeRank int
	seq      int
	// unreachableSince is when the node became unreachable; zero while it
	// is reachable (membership.go).
	unreachableSince time.Time
	unreachableWhy   string
	// attached: its agent opened its watch stream (Config.Attach; always
	// true without); joinedAt: when it joined, for the attach deadline.
	attached bool
	joinedAt time.Time
}

type rank struct {
	nodeID    string
	hostname  string
	localRank int
	state     RankState
	exitCode  int
	signal    string
	progress  *Progress
}

type barrier struct {
	arrived map[int][]uint64 // rank -> waiting calls
}

// New returns a machine waiting for its nodes.
func New(cfg Config) (*Machine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Machine{
		cfg:      cfg,
		state:    StateWaiting,
		nodes:    map[string]*node{},
		gen:      -1,
		barriers: map[string]*barrier{},
		released: map[string]bool{},
		waiters:  map[uint64]string{},
	}, nil
}

// Config returns the machine's configuration, defaults filled in.
func (m *Machine) Config() Config { return m.cfg }

// HasNode reports whether node id is part of the job now.
func (m *Machine) HasNode(id string) bool { return m.nodes[id] != nil }

// RootCause is the root cause of the latest generation's end and its
// description; nil and "" while none ended. It may name another rank than
// the EndGeneration did: blameLost, blameKilled.
func (m *Machine) RootCause() (*Failure, string) {
	return copyFailure(m.failure), m.reason
}

// Finished reports whether the job is over.
func (m *Machine) Finished() bool {
	return m.state == StateSucceeded || m.state == StateFailed
}

// Step feeds one event to the machine at time now and returns the actions the
// caller must carry out, in order. On error the event was rejected and the
// machine did not change.
func (m *Machine) Step(now time.Time, ev Event) ([]Action, error) {
	m.now = now
	if m.waitingSince.IsZero() {
		m.waitingSince = now
	}
	switch ev := ev.(type) {
	case NodeJoined:
		return m.join(ev)
	case NodeLost:
		return m.lost(ev)
	case NodeUnreachable:
		return m.unreachable(ev)
	case NodeReachable:
		return m.reachable(ev)
	case WorkerExited:
		return m.exited(ev)
	case WorkerParked:
		return m.parked(ev)
	case BarrierArrived:
		return m.arrive(ev)
	case BarrierCanceled:
		m.cancel(ev.Waiter)
		return nil, nil
	case ProgressReported:
		return nil, m.progress(now, ev)
	case Tick:
		if acts := m.rendezvousTick(); acts != nil {
			return acts, nil
		}
		if acts := m.membershipTick(); acts != nil { // membership.go
			return acts, nil
		}
		return append(m.tick(), m.hangTick()...), nil
	case EvidenceReported:
		m.evidence(ev)
		return nil, nil
	default:
		return nil, fmt.Errorf("%w: unknown event type %T", ErrInvalidEvent, ev)
	}
}

func (m *Machine) join(ev NodeJoined) ([]Action, error) {
	if err := m.checkJoin(ev); err != nil {
		return nil, err
	}
	info := ev.Info
	info.GPUs = slices.Clone(info.GPUs)
	m.nodes[ev.NodeID] = &node{id: ev.NodeID, info: info, groupRank: -1, host: ev.Host, nodeRank: max(ev.NodeRank, -1), seq: m.joins,
		attached: !m.cfg.Attach, joinedAt: m.now}
	m.joins++
	if info.PreflightFailure != "" {
		return m.failPreflight(m.nodes[ev.NodeID]), nil // preflight.go
	}
	if m.cfg.Attach {
		return nil, nil // it counts once attached (membership.go)
	}
	return m.joined(ev.NodeID), nil // membership.go
}

// checkJoin says why ev cannot join now; nil when it can.
func (m *Machine) checkJoin(ev NodeJoined) error {
	if m.Finished() {
		return fmt.Errorf("%w: node %q cannot join; start a new job", ErrJobFinished, ev.Info.Hostname)
	}
	if m.state != StateWaiting && m.placed() >= m.cfg.Nodes {
		return fmt.Errorf("%w: node %q cannot join generation %d: the job runs on its maximum of %s already (--nnodes %s)",
			ErrJobStarted, ev.Info.Hostname, m.gen, plural(m.cfg.Nodes, "node"), m.nnodes())
	}
	if pending := len(m.nodes) - m.placed(); pending >= m.cfg.Nodes {
		return fmt.Errorf("%w: node %q cannot join now: %s joined and have not attached yet (they are dropped %s after joining unless they do); try again then",
			ErrJobStarted, ev.Info.Hostname, plural(pending, "node"), m.cfg.NodeTimeout)
	}
	if err := validateJoin(ev); err != nil {
		return err
	}
	if err := m.checkPreflight(ev); err != nil { // preflight.go
		return err
	}
	if n := m.nodes[ev.NodeID]; n != nil {
		return fmt.Errorf("%w: node id %q is taken by %s", ErrDuplicateNode, ev.NodeID, n.info.Hostname)
	}
	for _, n := range m.nodes {
		if n.info.Hostname == ev.Info.Hostname && n.info.AgentPID == ev.Info.AgentPID {
			return fmt.Errorf("%w: the agent on %s with pid %d joined already as node %q; an agent joins once",
				ErrDuplicateNode, n.info.Hostname, n.info.AgentPID, n.id)
		}
	}
	return m.checkHost(ev) // order.go
}

func validateJoin(ev NodeJoined) error {
	in := ev.Info
	var problem string
	switch {
	case ev.NodeID == "":
		problem = "node id is empty"
	case in.Hostname == "":
		problem = "hostname is empty"
	case in.Address == "":
		problem = "address is empty: give the address other nodes reach this node at"
	case in.Nproc < 1:
		problem = fmt.Sprintf("nproc is %d: a node runs at least one worker", in.Nproc)
	case in.RanksPerGPU < 0:
		problem = fmt.Sprintf("ranks per GPU is %d: give 1 or more", in.RanksPerGPU)
	case len(in.GPUs) > 0 && in.Nproc > len(in.GPUs)*max(in.RanksPerGPU, 1):
		per := "one worker"
		if in.RanksPerGPU > 1 {
			per = fmt.Sprintf("%d workers", in.RanksPerGPU)
		}
		problem = fmt.Sprintf("nproc is %d but the node has %d GPUs: run at most %s per GPU", in.Nproc, len(in.GPUs), per)
	case in.FreePort < 1 || in.FreePort > 65535:
		problem = fmt.Sprintf("free port is %d: give a free TCP port (1-65535)", in.FreePort)
	default:
		return nil
	}
	return fmt.Errorf("%w: join from %q: %s", ErrInvalidEvent, in.Hostname, problem)
}

// start opens generation gen with the nodes present now.
func (m *Machine) start(gen int64, restarts int) StartGeneration {
	order := m.placedNodes() // order.go
	survivors := m.survivorsOf()
	m.pendingRestart, m.members.growing, m.members.actAt = false, false, time.Time{}
	m.straggle.replacing = false
	m.gen, m.restarts, m.state = gen, restarts, StateRunning
	m.ranks = m.ranks[:0]
	m.barriers, m.released, m.waiters = map[string]*barrier{}, map[string]bool{}, map[uint64]string{}
	sg := StartGeneration{
		Generation:   gen,
		RestartCount: m.cfg.RestartCountBase + restarts,
		MasterAddr:   order[0].info.Address,
		MasterPort:   order[0].info.FreePort,
	}
	for g, n := range order {
		n.groupRank = g
		na := NodeAssignment{NodeID: n.id, GroupRank: g}
		for local := range n.info.Nproc {
			gpu := -1
			if len(n.info.GPUs) > 0 {
				gpu = n.info.GPUs[gpuSlot(local, n.info.Nproc, len(n.info.GPUs))].Index
			}
			// A parked process keeps its node and local rank; its rank
			// may change when the job shrinks or grows.
			survivor := survivors[slot{n.id, local}]
			na.Ranks = append(na.Ranks, RankAssignment{Rank: len(m.ranks), LocalRank: local, GPU: gpu, Survivor: survivor})
			m.ranks = append(m.ranks, rank{nodeID: n.id, hostname: n.info.Hostname, localRank: local, state: RankRunning})
		}
		sg.Nodes = append(sg.Nodes, na)
	}
	sg.WorldSize = len(m.ranks)
	return sg
}

// gpuSlot is the position in its node's GPU list (NVLink order) of local
// rank local among nproc workers on gpus GPUs: the i-th GPU for one worker
// per GPU; with more workers than GPUs (several ranks per GPU), contiguous
// local ranks share a GPU, so that ring neighbours are mostly on one device.
func gpuSlot(local, nproc, gpus int) int {
	if nproc <= gpus {
		return local
	}
	return local * gpus / nproc
}

func (m *Machine) lost(ev NodeLost) ([]Action, error) {
	n := m.nodes[ev.NodeID]
	if n == nil {
		return nil, fmt.Errorf("%w %q lost", ErrUnknownNode, ev.NodeID)
	}
	delete(m.nodes, ev.NodeID)
	if m.state != StateRunning && m.state != StateRestarting {
		return nil, nil
	}
	var lostRanks []int
	for r := range m.ranks {
		if m.ranks[r].nodeID == n.id && m.ranks[r].state == RankRunning {
			m.ranks[r].state = RankLost
			lostRanks = append(lostRanks, r)
		}
	}
	if m.state == StateRestarting {
		m.blameLost(n, lostRanks, ev.Reason) // membership.go
		return m.afterEnd(), nil
	}
	if len(lostRanks) == 0 {
		if f, desc := m.leftEarly(n); f != nil { // order.go
			return append(m.end(f, desc), m.afterEnd()...), nil
		}
		// Its workers are done; the running generation does not need it.
		return nil, nil
	}
	reason := ev.Reason
	if reason == "" {
		reason = "node lost"
	}
	f := &Failure{
		Rank:     lostRanks[0],
		NodeID:   n.id,
		Hostname: n.info.Hostname,
		Pid:      n.info.AgentPID,
		Reason:   reason,
	}
	desc := fmt.Sprintf("node %s on %s (%s, agent pid %d; %s) was lost: %s", n.id, n.info.Hostname, n.info.Address, n.info.AgentPID, rankList(lostRanks), reason)
	return append(m.end(f, desc), m.afterEnd()...), nil
}

func rankList(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	if rs[len(rs)-1]-rs[0] == len(rs)-1 {
		return fmt.Sprintf("ranks %d-%d", rs[0], rs[len(rs)-1])
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ",")
}

// checkExit says why ev is refused; nil when Step takes it.
func (m *Machine) checkExit(ev WorkerExited) error {
	if m.nodes[ev.NodeID] == nil {
		return fmt.Errorf("%w %q reports rank %d exited; only nodes of the job report exits", ErrUnknownNode, ev.NodeID, ev.Rank)
	}
	if m.gen < 0 || ev.Generation > m.gen {
		return fmt.Errorf("%w: node %q reports rank %d of generation %d, which has not started (current generation: %d)",
			ErrInvalidEvent, ev.NodeID, ev.Rank, ev.Generation, m.gen)
	}
	if ev.Generation == m.gen && (ev.Rank < 0 || ev.Rank >= len(m.ranks) || m.ranks[ev.Rank].nodeID != ev.NodeID) {
		return fmt.Errorf("%w: rank %d does not run on node %q in generation %d", ErrInvalidEvent, ev.Rank, ev.NodeID, ev.Generation)
	}
	return nil
}

func (m *Machine) exited(ev WorkerExited) ([]Action, error) {
	if err := m.checkExit(ev); err != nil {
		return nil, err
	}
	if ev.Generation < m.gen {
		return nil, nil // a late report of an old generation
	}
	r := &m.ranks[ev.Rank]
	if r.state == RankParked {
		// A parked process ended before the next generation: it survives no
		// longer, and its agent starts a new one.
		r.state, r.exitCode, r.signal = RankStopped, ev.ExitCode, ev.Signal
		return nil, nil
	}
	if r.state != RankRunning {
		return nil, nil // reported already
	}
	r.exitCode, r.signal = ev.ExitCode, ev.Signal
	bad := ev.ExitCode != 0 || ev.Signal != ""
	if m.state == StateRestarting {
		r.state = RankExited
		if bad {
			r.state = RankStopped
			m.blameKilled(ev, r.hostname)
		}
		return m.afterEnd(), nil
	}
	if !bad {
		r.state = RankExited
		for _, r := range m.ranks {
			if r.state != RankExited {
				return nil, nil
			}
		}
		return m.finishSucceeded(), nil
	}
	r.state = RankFailed
	f := &Failure{
		Rank:       ev.Rank,
		NodeID:     ev.NodeID,
		Hostname:   r.hostname,
		Pid:        ev.Pid,
		ExitCode:   ev.ExitCode,
		Signal:     ev.Signal,
		StderrTail: slices.Clone(ev.StderrTail),
		OOMKilled:  ev.OOMKilled,
		XIDErrors:  slices.Clone(ev.XIDErrors),
		Notes:      slices.Clone(ev.Notes),
		Permanent:  ev.Permanent,
		Repeated:   ev.Repeated,
	}
	return append(m.end(f, describeExit(f)), m.afterEnd()...), nil
}

func describeExit(f *Failure) string {
	if f.Pid == 0 { // its process never started (the agent's spawn failed)
		return fmt.Sprintf("rank %d on %s could not be started (exit code %d)", f.Rank, f.Hostname, f.ExitCode)
	}
	if f.OOMKilled {
		return fmt.Sprintf("rank %d (pid %d) on %s was killed by the kernel's OOM killer (signal %s)", f.Rank, f.Pid, f.Hostname, cmp.Or(f.Signal, "SIGKILL"))
	}
	if f.Signal != "" {
		return fmt.Sprintf("rank %d (pid %d) on %s was killed by signal %s", f.Rank, f.Pid, f.Hostname, f.Signal)
	}
	return fmt.Sprintf("rank %d (pid %d) on %s exited with code %d", f.Rank, f.Pid, f.Hostname, f.ExitCode)
}

// blameKilled makes a rank killed by a signal (or the OOM killer) that
// gotrain did not send, reported while the generation ends, the root cause
// instead of a plain exit seen just before: a rank killed with SIGKILL
// takes its sockets with it, its peers' collectives fail at once, and a
// peer's exit 1 may reach the coordinator first — the report must name the
// rank that was killed, not the one that noticed. The restart is announced
// only once every rank is accounted for, so the killed rank's report is in
// by then.
func (m *Machine) blameKilled(ev WorkerExited, hostname string) {
	f := m.failure
	killed := ev.Signal != "" || ev.OOMKilled
	if ev.Stopped || !killed || f == nil || f.Reason != "" || f.Signal != "" || f.OOMKilled || f.Pid == 0 ||
		m.now.Sub(m.members.endedAt) > blameWindow {
		return
	}
	m.failure = &Failure{
		Rank: ev.Rank, NodeID: ev.NodeID, Hostname: hostname, Pid: ev.Pid,
		ExitCode: ev.ExitCode, Signal: ev.Signal, OOMKilled: ev.OOMKilled,
		StderrTail: slices.Clone(ev.StderrTail), XIDErrors: slices.Clone(ev.XIDErrors),
		Notes: append(slices.Clone(ev.Notes), fmt.Sprintf("rank %d on %s exited with code %d just before, most likely because of this: its peers' collectives fail when a rank is killed", f.Rank, f.Hostname, f.ExitCode)),
	}
	m.reason = describeExit(m.failure)
}

// end closes the running generation with root cause f.
func (m *Machine) end(f *Failure, desc string) []Action { return m.endReplacing(f, desc, nil) }

// endReplacing closes the running generation with root cause f; the
// processes of ranks replace must not survive it.
func (m *Machine) endReplacing(f *Failure, desc string, replace []int) []Action {
	m.failure, m.reason, m.state = f, desc, StateRestarting
	m.members.endedAt = m.now
	acts := []Action{EndGeneration{Generation: m.gen, Reason: desc, Failure: copyFailure(f), Replace: slices.Clone(replace)}}
	return append(acts, m.failBarriers(fmt.Sprintf("generation %d ended: %s", m.gen, desc))...)
}

// afterEnd restarts or finishes once every rank of the ended generation is
// accounted for.
func (m *Machine) afterEnd() []Action {
	for _, r := range m.ranks {
		if r.state == RankRunning {
			return nil
		}
	}
	if m.members.growing && m.placed() >= m.cfg.MinNodes {
		// Not a failure: the job grows by the nodes that joined (unless
		// losses since left too few: then it is one, below).
		return []Action{m.start(m.gen+1, m.restarts)}
	}
	if m.straggle.replacing && m.placed() >= m.cfg.MinNodes {
		// Not a failure either: a persistent straggler is being replaced,
		// and the replacement does not count against MaxRestarts
		// (straggler_replace.go says why).
		return []Action{m.start(m.gen+1, m.restarts)}
	}
	pm := m.postMortem()                          // hang_detect.go: a mismatch behind the failure
	repeated := m.repeats.ended(m.gen, m.failure) // restart.go
	var why string
	switch {
	case m.placed() < m.cfg.MinNodes:
		// A finished job takes no joins: the lost nodes cannot come back to it.
		again := "start the job again, with a lower minimum to go on with fewer nodes"
		if m.cfg.MinNodes == m.cfg.Nodes {
			again = "start the job again (under --nnodes MIN:MAX a job goes on without a lost node)"
		}
		why = fmt.Sprintf("only %d of the %s it needs remain (--nnodes %s); %s", m.placed(), plural(m.cfg.MinNodes, "node"), m.nnodes(), again)
	case m.failure != nil && m.failure.Permanent != "" && (!m.repeats.movedIn(m.gen) || m.failure.Repeated):
		why = m.failure.Permanent + ", so a restart can only fail the same way (--retry-permanent retries it anyway)"
	case m.cfg.MaxRestarts == 0:
		why = "restarts are off (max restarts 0)"
	case m.restarts >= m.cfg.MaxRestarts:
		why = fmt.Sprintf("all restarts are spent (max restarts %d)", m.cfg.MaxRestarts)
	default:
		return append(pm, m.restartOrWait(repeated)...)
	}
	m.pendingRestart = false
	m.state = StateFailed
	return append(pm, FinishJob{
		ExitCode: exitCode(m.failure),
		Failure:  copyFailure(m.failure),
		Message:  fmt.Sprintf("job failed in generation %d: %s%s; not restarting: %s", m.gen, m.reason, repeatNote(repeated), why),
	})
}

func (m *Machine) finishSucceeded() []Action {
	m.state = StateSucceeded
	acts := m.failBarriers("the job finished")
	return append(acts, FinishJob{
		Succeeded: true,
		Message: fmt.Sprintf("job succeeded: %s exited with code 0 in generation %d after %s",
			plural(len(m.ranks), "rank"), m.gen, plural(m.restarts, "restart")),
	})
}

// exitCode is the code a launcher exits with for root cause f.
func exitCode(f *Failure) int {
	switch {
	case f == nil: // nodes lost while the job grew: no rank failed
		return 1
	case f.Reason != "":
		return 1
	case f.Signal != "":
		if n, ok := signalNumber(f.Signal); ok {
			return 128 + n
		}
		return 1
	case f.ExitCode > 0:
		return f.ExitCode
	default:
		return 1
	}
}

// checkArrive says why ev is refused; nil when Step takes it.
func (m *Machine) checkArrive(ev BarrierArrived) error {
	if ev.Name == "" {
		return fmt.Errorf("%w: barrier name is empty", ErrInvalidEvent)
	}
	if _, dup := m.waiters[ev.Waiter]; dup {
		return fmt.Errorf("%w: barrier waiter %d is waiting already", ErrInvalidEvent, ev.Waiter)
	}
	if m.state == StateRunning && ev.Generation == m.gen && (ev.Rank < 0 || ev.Rank >= len(m.ranks)) {
		return fmt.Errorf("%w: barrier %q: rank %d is outside world size %d", ErrInvalidEvent, ev.Name, ev.Rank, len(m.ranks))
	}
	return nil
}

func (m *Machine) arrive(ev BarrierArrived) ([]Action, error) {
	if err := m.checkArrive(ev); err != nil {
		return nil, err
	}
	if m.state != StateRunning || ev.Generation != m.gen {
		return []Action{FailBarrier{Name: ev.Name, Generation: ev.Generation, Waiters: []uint64{ev.Waiter}, Reason: m.notRunning(ev.Generation)}}, nil
	}
	if m.released[ev.Name] {
		return []Action{ReleaseBarrier{Name: ev.Name, Generation: ev.Generation, Waiters: []uint64{ev.Waiter}}}, nil
	}
	b := m.barriers[ev.Name]
	if b == nil {
		b = &barrier{arrived: map[int][]uint64{}}
		m.barriers[ev.Name] = b
	}
	b.arrived[ev.Rank] = append(b.arrived[ev.Rank], ev.Waiter)
	m.waiters[ev.Waiter] = ev.Name
	if len(b.arrived) < len(m.ranks) {
		return nil, nil
	}
	delete(m.barriers, ev.Name)
	m.released[ev.Name] = true
	return []Action{ReleaseBarrier{Name: ev.Name, Generation: m.gen, Waiters: m.takeWaiters(b)}}, nil
}

// notRunning says why generation gen takes no barrier calls.
func (m *Machine) notRunning(gen int64) string {
	switch {
	case m.Finished():
		return "the job is finished"
	case m.gen < 0 || gen > m.gen:
		return fmt.Sprintf("generation %d has not started", gen)
	case gen < m.gen || m.state == StateRestarting:
		return fmt.Sprintf("generation %d has ended; wait for the next generation", gen)
	}
	return fmt.Sprintf("generation %d is not running", gen)
}

func (m *Machine) cancel(w uint64) {
	name, ok := m.waiters[w]
	if !ok {
		return
	}
	delete(m.waiters, w)
	b := m.barriers[name]
	for r, ws := range b.arrived {
		if i := slices.Index(ws, w); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
			if len(ws) == 0 {
				delete(b.arrived, r)
			} else {
				b.arrived[r] = ws
			}
		}
	}
	if len(b.arrived) == 0 {
		delete(m.barriers, name)
	}
}

// takeWaiters forgets b's waiting calls and returns them sorted.
func (m *Machine) takeWaiters(b *barrier) []uint64 {
	var ws []uint64
	for _, rw := range b.arrived {
		ws = append(ws, rw...)
	}
	for _, w := range ws {
		delete(m.waiters, w)
	}
	slices.Sort(ws)
	return ws
}

// failBarriers fails every pending barrier of the current generation.
func (m *Machine) failBarriers(reason string) []Action {
	names := make([]string, 0, len(m.barriers))
	for name := range m.barriers {
		names = append(names, name)
	}
	slices.Sort(names)
	var acts []Action
	for _, name := range names {
		acts = append(acts, FailBarrier{Name: name, Generation: m.gen, Waiters: m.takeWaiters(m.barriers[name]), Reason: reason})
		delete(m.barriers, name)
	}
	return acts
}

// checkProgress says why ev is refused; nil when Step takes it.
func (m *Machine) checkProgress(ev ProgressReported) error {
	if m.nodes[ev.NodeID] == nil {
		return fmt.Errorf("%w %q reports progress; only nodes of the job report progress", ErrUnknownNode, ev.NodeID)
	}
	for _, p := range ev.Ranks {
		if m.currentProgress(p) && (p.Rank < 0 || p.Rank >= len(m.ranks) || m.ranks[p.Rank].nodeID != ev.NodeID) {
			return fmt.Errorf("%w: progress for rank %d, which does not run on node %q in generation %d", ErrInvalidEvent, p.Rank, ev.NodeID, m.gen)
		}
	}
	return nil
}

// currentProgress: p is of the running generation (others are ignored).
func (m *Machine) currentProgress(p Progress) bool {
	return m.gen >= 0 && p.Generation == m.gen && !m.Finished()
}

func (m *Machine) progress(now time.Time, ev ProgressReported) error {
	if err := m.checkProgress(ev); err != nil {
		return err
	}
	for _, p := range ev.Ranks {
		if !m.currentProgress(p) {
			continue
		}
		p.Comms = slices.Clone(p.Comms)
		p.Received = now
		m.ranks[p.Rank].progress = &p
		m.repeats.observe(m.gen, p) // restart.go
	}
	return nil
}

// Status returns a snapshot of the job; it shares no memory with the machine.
func (m *Machine) Status() Status {
	st := Status{
		RunID:        m.cfg.RunID,
		State:        m.state,
		Generation:   max(m.gen, 0),
		WorldSize:    len(m.ranks),
		RestartCount: m.cfg.RestartCountBase + m.restarts,
		Failure:      copyFailure(m.failure),
		Verdicts:     m.Verdicts(),
	}
	for _, n := range m.orderedNodes() {
		info := n.info
		info.GPUs = slices.Clone(info.GPUs)
		st.Nodes = append(st.Nodes, NodeStatus{NodeID: n.id, Info: info, GroupRank: n.groupRank})
	}
	for i, r := range m.ranks {
		rs := RankStatus{
			Rank:      i,
			NodeID:    r.nodeID,
			Hostname:  r.hostname,
			LocalRank: r.localRank,
			State:     r.state,
			ExitCode:  r.exitCode,
			Signal:    r.signal,
		}
		if r.progress != nil {
			p := *r.progress
			p.Comms = slices.Clone(p.Comms)
			rs.Progress = &p
		}
		st.Ranks = append(st.Ranks, rs)
	}
	return st
}

func copyFailure(f *Failure) *Failure {
	if f == nil {
		return nil
	}
	c := *f
	c.StderrTail = slices.Clone(f.StderrTail)
	c.XIDErrors = slices.Clone(f.XIDErrors)
	c.Notes = slices.Clone(f.Notes)
	return &c
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
