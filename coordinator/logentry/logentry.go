// Package logentry is the wire form of a replicated coordinator's log
// entries (gotrainv1.LogEntry: a typed request with its time) and of its
// snapshots (gotrainv1.StateSnapshot), and their conversion to and from
// package state's Go values. Decode is the one way in: an entry of a type
// it does not know, or of a later version, is an error, never skipped.
package logentry

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/coordinator/job"
	"github.com/gotrain/gotrain/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Version is the version of the entries this package writes and reads.
const Version = 1

// ErrUnknown is wrapped by Decode's error for an entry it cannot read.
var ErrUnknown = errors.New("logentry: unknown entry")

// Stamp sets e's version and time (the leader's now) and returns it.
func Stamp(e *gotrainv1.LogEntry, now time.Time) *gotrainv1.LogEntry {
	e.Version, e.UnixNanos = Version, now.UnixNano()
	return e
}

// Marshal is e as the log holds it.
func Marshal(e *gotrainv1.LogEntry) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(e)
}

// Decode reads an entry of the log.
func Decode(b []byte) (state.Entry, error) {
	pe := &gotrainv1.LogEntry{}
	if err := proto.Unmarshal(b, pe); err != nil {
		return state.Entry{}, fmt.Errorf("%w: %v", ErrUnknown, err)
	}
	e, err := FromProto(pe)
	e.Raw = b
	return e, err
}

// FromProto converts an entry.
func FromProto(pe *gotrainv1.LogEntry) (state.Entry, error) {
	if v := pe.GetVersion(); v != Version {
		return state.Entry{}, fmt.Errorf("%w: version %d, this replica reads version %d (replicas of different gotrain versions?)", ErrUnknown, v, Version)
	}
	e := state.Entry{Time: time.Unix(0, pe.GetUnixNanos()).UTC()}
	switch x := pe.GetEntry().(type) {
	case *gotrainv1.LogEntry_Config:
		c := ConfigFromProto(x.Config)
		e.Config = &c
	case *gotrainv1.LogEntry_Join:
		j := JoinFromProto(x.Join.GetRequest(), x.Join.GetHost(), x.Join.GetCsrSha256())
		e.Join = &j
	case *gotrainv1.LogEntry_KvPut:
		e.KV = &state.KV{Key: x.KvPut.GetKey(), Value: x.KvPut.GetValue()}
	case *gotrainv1.LogEntry_Replica:
		e.Replica = &state.Replica{Addr: x.Replica.GetAddr(), Node: x.Replica.GetNodeId()}
	case *gotrainv1.LogEntry_Tick:
		e.Event = job.Tick{}
	case *gotrainv1.LogEntry_NodeLost:
		e.Event = job.NodeLost{NodeID: x.NodeLost.GetNodeId(), Reason: x.NodeLost.GetReason()}
	case *gotrainv1.LogEntry_NodeUnreachable:
		e.Event = job.NodeUnreachable{NodeID: x.NodeUnreachable.GetNodeId(), Reason: x.NodeUnreachable.GetReason()}
	case *gotrainv1.LogEntry_NodeReachable:
		e.Event = job.NodeReachable{NodeID: x.NodeReachable.GetNodeId()}
	case *gotrainv1.LogEntry_WorkerExit:
		e.Event = WorkerExit(x.WorkerExit)
	case *gotrainv1.LogEntry_Barrier:
		b := x.Barrier
		e.Event = job.BarrierArrived{Name: b.GetName(), Generation: b.GetGeneration(), Rank: int(b.GetRank()), Waiter: b.GetWaiter()}
	case *gotrainv1.LogEntry_BarrierCanceled:
		e.Event = job.BarrierCanceled{Waiter: x.BarrierCanceled.GetWaiter()}
	case *gotrainv1.LogEntry_Progress:
		ev := job.ProgressReported{NodeID: x.Progress.GetNodeId()}
		for _, p := range x.Progress.GetRanks() {
			ev.Ranks = append(ev.Ranks, Progress(p))
		}
		e.Event = ev
	case *gotrainv1.LogEntry_Evidence:
		ev := job.EvidenceReported{NodeID: x.Evidence.GetNodeId(), VerdictID: x.Evidence.GetRequestId()}
		for _, p := range x.Evidence.GetEvidence() {
			ev.Evidence = append(ev.Evidence, job.Evidence{Rank: int(p.GetRank()), Pid: int(p.GetPid()), Kind: p.GetKind(), Text: p.GetText()})
		}
		e.Event = ev
	default:
		if len(pe.ProtoReflect().GetUnknown()) > 0 {
			return state.Entry{}, fmt.Errorf("%w: an entry of a type this replica does not know (a newer gotrain's?)", ErrUnknown)
		}
		return state.Entry{}, fmt.Errorf("%w: an empty entry", ErrUnknown)
	}
	return e, nil
}

// Snapshot is st as a snapshot: the entries that made it, compacted.
func Snapshot(st *state.State) ([]byte, error) {
	return proto.Marshal(&gotrainv1.StateSnapshot{Version: Version, Entries: st.Compact(), Applied: st.Applied()})
}

// Restore is the state a snapshot holds: a state of own (this replica's
// configuration, until the snapshot's config entry) with its entries
// applied. Their effects are not carried out (the replica does not act on
// the past), but a finished job is: see State.Result.
func Restore(b []byte, own job.Config) (*state.State, error) {
	var snap gotrainv1.StateSnapshot
	if err := proto.Unmarshal(b, &snap); err != nil {
		return nil, fmt.Errorf("restore the coordinator's state: %w", err)
	}
	if snap.GetVersion() != Version {
		return nil, fmt.Errorf("restore the coordinator's state: %w: snapshot version %d, this replica reads version %d", ErrUnknown, snap.GetVersion(), Version)
	}
	st, err := state.New(own)
	if err != nil {
		return nil, err
	}
	for i, raw := range snap.GetEntries() {
		e, err := Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("restore the coordinator's state: entry %d: %w", i, err)
		}
		st.Apply(e)
	}
	st.SetApplied(snap.GetApplied())
	return st, nil
}
