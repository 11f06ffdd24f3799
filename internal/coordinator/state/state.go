package state

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/kv"
	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// State is a coordinator's replicated state. It is not safe for
// concurrent use: the server holds its lock around every call.
type State struct {
	cfg        Config
	configured bool
	m          *job.Machine
	nodeSeq    int
	joinKeys   map[string]string // JoinKey -> node id: a Join retried is the same node
	nproc      map[string]int    // node id -> nproc, of the nodes present (admission)
	out        map[string]*Outbox
	kv, comm   *kv.Store
	result     *job.FinishJob
	plan       restartPlan
	peers      []string          // the replica set (gRPC addresses)
	asked      []string          // nodes asked to host a replica
	askedHosts []string          // their addresses
	hostOf     map[string]string // embedded: each replica's node (by gRPC address)
	beating    map[string]bool   // nodes whose heartbeats are in the log
	applied    uint64            // entries of the log applied (refused ones too)
	effects    []Effect          // of the entry being applied
	// health: the verdicts against machines, by hostname (health.go);
	// hostnames: each node present's, for them; now: the time of the
	// entry applied last, which admission decides at.
	health    map[string][]policy.Record
	hostnames map[string]string
	now       time.Time
}

// restartPlan is what a restart's announcement needs: the generation that
// ended (nil once announced), its world size, and the restart count of the
// generation that runs.
type restartPlan struct {
	Ended    *job.EndGeneration
	World    int
	Restarts int
}

// New returns the state before the log's first entry: a machine of own
// (this replica's own configuration, which the config entry replaces).
func New(own job.Config) (*State, error) {
	own.Attach = true // attaches: see applyConfig
	m, err := job.New(own)
	if err != nil {
		return nil, err
	}
	return &State{m: m, out: map[string]*Outbox{}, kv: kv.New(), comm: kv.New(), joinKeys: map[string]string{}, nproc: map[string]int{},
		hostOf: map[string]string{}, beating: map[string]bool{}, hostnames: map[string]string{}}, nil
}

// Machine is the job machine, to read (Status, Config, HasNode, ...): only
// Apply steps it.
func (s *State) Machine() *job.Machine { return s.m }

// Configured says whether the config entry was applied.
func (s *State) Configured() bool { return s.configured }

// Config is the config entry's configuration.
func (s *State) Config() Config { return s.cfg }

// Outbox is node id's outbox, nil when the node is not present.
func (s *State) Outbox(id string) *Outbox { return s.out[id] }

// Nodes are the ids of the nodes present (with an outbox), in join order.
func (s *State) Nodes() []string { return slices.SortedFunc(maps.Keys(s.out), NodeOrder) }

// Peers is the replica set (gRPC addresses).
func (s *State) Peers() []string { return slices.Clone(s.peers) }

// Result is how the job finished; nil before.
func (s *State) Result() *job.FinishJob { return s.result }

// Beating says whether node id's heartbeats are in the log.
func (s *State) Beating(id string) bool { return s.beating[id] }

// Applied counts the entries of the log applied.
func (s *State) Applied() uint64 { return s.applied }

// SetApplied sets the count of entries applied (a snapshot restored).
func (s *State) SetApplied(n uint64) { s.applied = n }

// AskedToHost says whether node id, present, was asked to host a replica
// that is not in the set (yet).
func (s *State) AskedToHost(id string) bool {
	return slices.Contains(s.asked, id) && s.m.HasNode(id) && !s.hosts(id)
}

// Hosts says whether node id hosts a replica of the set.
func (s *State) Hosts(id string) bool { return s.hosts(id) }

func (s *State) hosts(id string) bool {
	return slices.Contains(slices.Collect(maps.Values(s.hostOf)), id)
}

// Store is the store that holds key: a communicator's rendezvous key
// (CommKey: only the node of its rank may put it, in the running
// generation) has a store of its own, with its own bounds, so that other
// keys filling theirs cannot make every restart's rendezvous fail.
func (s *State) Store(key string) *kv.Store {
	if _, _, ok := CommKey(key); ok {
		return s.comm
	}
	return s.kv
}

// Apply applies e: the answer for the call that proposed it, and what the
// server is to do. A refused entry (Result.Err) changes nothing.
func (s *State) Apply(e Entry) (Result, []Effect) {
	s.effects = nil
	s.applied++
	if !e.Time.IsZero() {
		s.now = e.Time
	}
	r := s.apply(e)
	effects := s.effects
	s.effects = nil
	return r, effects
}

func (s *State) apply(e Entry) Result {
	if e.Config == nil && !s.configured {
		s.log(LevelError, "replicate: an entry before the job's configuration")
	}
	switch {
	case e.Config != nil:
		return Result{Err: s.applyConfig(*e.Config)}
	case e.Join != nil:
		j, err := s.applyJoin(e.Time, *e.Join)
		return Result{Join: j, Err: err}
	case e.KV != nil:
		if err := s.Store(e.KV.Key).Put(e.KV.Key, e.KV.Value); err != nil {
			return Result{Err: err}
		}
		s.recordGang(e.Time, e.KV.Key, e.KV.Value) // health.go
		s.emit(KeyPut{Key: e.KV.Key})
		return Result{}
	case e.Replica != nil:
		s.addPeer(e.Replica.Addr, e.Replica.Node)
		return Result{}
	case e.Event != nil:
		return Result{Err: s.applyEvent(e.Time, e.Event)}
	}
	return Result{Err: refuse(Internal, "replicate: an empty log entry")}
}

func (s *State) emit(e Effect) { s.effects = append(s.effects, e) }

func (s *State) log(level Level, msg string, args ...any) {
	s.emit(Log{Level: level, Msg: msg, Args: args})
}

// applyConfig sets the job's configuration from the log: once.
func (s *State) applyConfig(c Config) error {
	if s.configured {
		return nil
	}
	// The coordinator reports each node's first watch stream as its
	// attach (internal/coordinator/reach.go): a node counts for the job from then
	// on, and one that never attaches is dropped (internal/coordinator/job's
	// membership.go). Every replica applies the same.
	c.Job.Attach = true
	m, err := job.New(c.Job)
	if err != nil {
		return refuse(Invalid, "the job's configuration: %v", err)
	}
	s.m, s.configured, s.cfg = m, true, c
	s.cfg.Peers = slices.Clone(c.Peers)
	s.peers = slices.Clone(c.Peers)
	return nil
}

// push appends ev to node id's outbox, numbered.
func (s *State) push(id string, ev Out) {
	o := s.out[id]
	if o == nil {
		return
	}
	ev.Seq = uint64(len(o.Events) + 1)
	o.Events = append(o.Events, ev)
	s.emit(Wake{Node: id})
}

// pushAll appends ev to every node's outbox, in join order.
func (s *State) pushAll(ev Out) {
	for _, id := range s.Nodes() {
		s.push(id, ev)
	}
}

// applyEvent feeds ev, at now, to the machine and follows up its actions.
func (s *State) applyEvent(now time.Time, ev job.Event) error {
	if lost, ok := ev.(job.NodeLost); ok {
		s.dropNode(now, lost.NodeID, lost.Reason, policy.Lost)
	}
	acts, err := s.m.Step(now, ev)
	if err != nil {
		return err
	}
	s.actions(acts)
	s.announceWait(now)
	s.dropLost()
	s.deadline()
	s.replaceLostReplicas()
	if p, ok := ev.(job.ProgressReported); ok {
		s.emit(Heard{Node: p.NodeID}) // a report (a heartbeat when empty) overrules gossip
		s.beating[p.NodeID] = true
	}
	return nil
}

// actions follows up the machine's actions.
func (s *State) actions(acts []job.Action) {
	for _, a := range acts {
		switch a := a.(type) {
		case job.StartGeneration:
			s.pruneRendezvous(a.Generation)
			s.announceRestart(a.RestartCount, 0) // one that starts at once
			s.plan.Restarts = a.RestartCount
			s.log(LevelInfo, "generation started", "generation", a.Generation, "world_size", a.WorldSize,
				"restart_count", a.RestartCount, "master", hostPort(a.MasterAddr, a.MasterPort))
			for _, n := range a.Nodes {
				s.push(n.NodeID, Out{Started: &a})
			}
			if a.Generation == 0 {
				s.sayOneHostReplicas(a.Nodes) // replicas.go
			}
		case job.EndGeneration:
			// Info: the agents print the line a person reads (RestartPlanned, or the report)
			s.log(LevelInfo, "generation ended", "generation", a.Generation, "reason", a.Reason)
			s.plan.Ended, s.plan.World = &a, s.m.Status().WorldSize
			s.pushAll(Out{Ended: &a})
		case job.DropNode:
			// A persistent straggler's node (--on-straggler replace): its
			// agent reads why in the end of its stream, stops its workers
			// and exits; the job goes on without it.
			kind := policy.Lost
			if a.Straggler {
				kind = policy.Straggler
			}
			s.dropNode(s.now, a.NodeID, a.Reason, kind)
		case job.FinishJob:
			s.result = &a
			if a.Succeeded {
				s.log(LevelInfo, "job finished", "message", a.Message)
			} else {
				s.log(LevelInfo, "job finished", "exit_code", a.ExitCode, "message", a.Message)
			}
			s.pushAll(Out{Finished: &a})
			for _, o := range s.out {
				o.Closed = true
			}
			s.emit(Finish{Result: a})
		case job.HangDetected:
			s.hangDetected(a)
		case job.ReleaseBarrier:
			for _, w := range a.Waiters {
				s.emit(Answer{Waiter: w})
			}
		case job.FailBarrier:
			for _, w := range a.Waiters {
				s.emit(Answer{Waiter: w, Failed: fmt.Sprintf("barrier %q of generation %d failed: %s", a.Name, a.Generation, a.Reason)})
			}
		default:
			s.log(LevelError, "unknown action from the job machine", "action", fmt.Sprintf("%T", a))
		}
	}
}

// pruneRendezvous drops the communicators' rendezvous keys of the
// generations before gen: no rank of an ended generation reads them, and
// kept they would fill the rendezvous store as the job restarts.
func (s *State) pruneRendezvous(gen int64) {
	n := s.comm.Prune(func(key string) bool {
		g, _, ok := CommKey(key)
		return ok && g < gen
	})
	if n > 0 {
		s.log(LevelDebug, "rendezvous keys of ended generations dropped", "keys", n, "generation", gen)
	}
}

// hangDetected logs a verdict and tells every agent: each prints it, and
// the agents of the ranks it names collect evidence.
func (s *State) hangDetected(a job.HangDetected) {
	v := a.Verdict
	// Info: the agents print the verdict for people; this is the record.
	s.log(LevelInfo, "hang detector", "kind", string(v.Kind), "generation", v.Generation, "comm", v.Comm,
		"seq", v.Collective.Seq, "post_mortem", a.PostMortem, "summary", v.Summary)
	if a.PostMortem {
		return // the job's failure message carries it
	}
	for _, id := range s.Nodes() {
		req := &EvidenceRequest{Verdict: v}
		for _, t := range a.Collect {
			if t.NodeID == id {
				req.Ranks = append(req.Ranks, t.Ranks...)
			}
		}
		s.push(id, Out{Evidence: req})
	}
}

// deadline asks for a Tick at the machine's next deadline (a restart
// waiting out its backoff, a settling join), so that it acts on time
// rather than on the next coarse tick.
func (s *State) deadline() {
	if d, ok := s.m.Deadline(); ok {
		s.emit(ArmDeadline{At: d})
	}
}

// announceRestart tells every node that the next generation, restart
// number restarts, starts after wait, when it follows the ended generation
// the plan holds (not a generation that grows an elastic job, nor one
// already announced).
func (s *State) announceRestart(restarts int, wait time.Duration) {
	e := s.plan.Ended
	if e == nil || restarts <= s.plan.Restarts {
		return
	}
	s.plan.Ended = nil
	if f, reason := s.m.RootCause(); f != nil {
		// A report seen after the end may have named the true cause since
		// (a lost node, a rank killed by a signal): job.blameLost, blameKilled.
		e.Failure, e.Reason = f, reason
	}
	maxRestarts := s.m.Config().MaxRestarts
	s.log(LevelInfo, "restarting", "generation", e.Generation+1, "restart_count", restarts, "max_restarts", maxRestarts, "in", wait, "reason", e.Reason)
	s.pushAll(Out{Restarting: &Restart{Ended: *e, World: s.plan.World, Attempt: restarts + 1, MaxAttempts: maxRestarts + 1, Wait: wait}})
}

// announceWait announces a restart that waits out its backoff, once the
// machine has decided on it (every rank of the ended generation stopped).
func (s *State) announceWait(now time.Time) {
	if s.plan.Ended == nil || s.m.Status().State != job.StateRestarting {
		return
	}
	if d, ok := s.m.Deadline(); ok {
		s.announceRestart(s.plan.Restarts+1, max(d.Sub(now), 0))
	}
}

// dropNode ends the stream of a node about to be lost (kind: dropped as a
// straggler).
func (s *State) dropNode(now time.Time, id, reason string, kind policy.Kind) {
	if s.out[id] == nil || s.m.Finished() {
		return
	}
	s.forget(now, id, reason, kind)
}

// dropLost ends the streams of nodes the machine no longer has (lost after
// their node timeout), so that an agent that comes back stops its workers.
func (s *State) dropLost() {
	if s.m.Finished() {
		return
	}
	for _, id := range s.Nodes() {
		if !s.m.HasNode(id) {
			s.forget(s.now, id, fmt.Sprintf("out of contact for longer than the node timeout (%s)", s.m.Config().NodeTimeout), policy.Lost)
		}
	}
}

func (s *State) forget(now time.Time, id, reason string, kind policy.Kind) {
	s.record(now, s.hostnames[id], kind, "", reason) // health.go
	delete(s.hostnames, id)
	delete(s.out, id)
	delete(s.nproc, id)
	s.emit(Drop{Node: id, Reason: reason})
	s.log(LevelWarn, "node lost", "node_id", id, "reason", reason)
}

// hostPort is net.JoinHostPort's form.
func hostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// NodeOrder orders node ids ("node-N") by N: the order they joined.
func NodeOrder(a, b string) int {
	na, errA := strconv.Atoi(strings.TrimPrefix(a, "node-"))
	nb, errB := strconv.Atoi(strings.TrimPrefix(b, "node-"))
	if errA != nil || errB != nil {
		return strings.Compare(a, b)
	}
	return na - nb
}

// CommKey maps a communicator's rendezvous key to the generation and rank
// whose node alone may put it: "ncclcomm/.../GEN/id" (rank 0's),
// "cpucomm/.../GEN/addr/RANK".
func CommKey(key string) (gen int64, rank int, ok bool) {
	parts := strings.Split(key, "/")
	n := len(parts)
	switch {
	case parts[0] == "ncclcomm" && n >= 4 && parts[n-1] == "id":
		g, err := strconv.ParseInt(parts[n-2], 10, 64)
		return g, 0, err == nil
	case parts[0] == "cpucomm" && n >= 5 && parts[n-2] == "addr":
		g, err1 := strconv.ParseInt(parts[n-3], 10, 64)
		r, err2 := strconv.Atoi(parts[n-1])
		return g, r, err1 == nil && err2 == nil
	}
	return 0, 0, false
}

// Asked says whether node id was asked to host a replica.
func (s *State) Asked(id string) bool { return slices.Contains(s.asked, id) }

// SetKVLimits gives the KV store (not the rendezvous store) other bounds
// than kv.DefaultLimits; before the first KV entry (tests).
func (s *State) SetKVLimits(lim kv.Limits) { s.kv = kv.NewWithLimits(lim) }
