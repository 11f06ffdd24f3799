// Package logentry is the wire form of a replicated coordinator's log
// entries (gotrainv1.LogEntry: a typed request with its time) and of its
// snapshots (gotrainv1.StateSnapshot), and their conversion to and from
// package state's Go values. Decode is the one way in: an entry of a type
// it does not know, or of a later version, is an error, never skipped.
package logentry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/state"
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
	return FromProto(pe)
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

// SnapshotVersion is the version of the snapshots this package writes and
// reads: 2, the state's tables (1 held the entries that made them).
const SnapshotVersion = 2

// MaxSnapshotBytes bounds the snapshot Restore reads: the state's bounds
// (the stores' 256 MiB each, the outboxes, the machine) fit well within
// it; more is not a snapshot of ours.
const MaxSnapshotBytes int64 = 2 << 30

// ErrBadSnapshot is wrapped by Restore's error for a snapshot it cannot
// read or whose state differs from its digest.
var ErrBadSnapshot = errors.New("logentry: bad snapshot")

// Snapshot is st as a snapshot: its tables (state.Image), not its history,
// with its digest.
func Snapshot(st *state.State) ([]byte, error) {
	tables, err := json.Marshal(st.Image())
	if err != nil {
		return nil, fmt.Errorf("snapshot the coordinator's state: %w", err)
	}
	d := st.Digest()
	return proto.Marshal(&gotrainv1.StateSnapshot{Version: SnapshotVersion, Applied: st.Applied(), Tables: tables, Digest: d[:]})
}

// Restore is the state a snapshot holds. A snapshot is another process's
// input: it is bounded, every table is checked (state.FromImage), and the
// restored state's digest must equal the one the snapshot carries; any
// breach is an error wrapping ErrBadSnapshot (or ErrUnknown for another
// version), never a panic. own is this replica's configuration; the
// snapshot's replaces it, as the log's config entry would.
func Restore(b []byte, own job.Config) (*state.State, error) {
	fail := func(format string, args ...any) (*state.State, error) {
		return nil, fmt.Errorf("restore the coordinator's state: %w: %s", ErrBadSnapshot, fmt.Sprintf(format, args...))
	}
	if int64(len(b)) > MaxSnapshotBytes {
		return fail("%d bytes, at most %d", len(b), MaxSnapshotBytes)
	}
	var snap gotrainv1.StateSnapshot
	if err := proto.Unmarshal(b, &snap); err != nil {
		return fail("%v", err)
	}
	if v := snap.GetVersion(); v != SnapshotVersion {
		return nil, fmt.Errorf("restore the coordinator's state: %w: snapshot version %d, this replica reads version %d (replicas of different gotrain versions? run one version in a job)", ErrUnknown, v, SnapshotVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(snap.GetTables()))
	dec.DisallowUnknownFields() // a table this version does not know would be dropped
	var im state.Image
	if err := dec.Decode(&im); err != nil {
		return fail("tables: %v", err)
	}
	if dec.More() {
		return fail("tables: data after the image")
	}
	st, err := state.FromImage(im)
	if err != nil {
		return nil, fmt.Errorf("restore the coordinator's state: %w: %w", ErrBadSnapshot, err)
	}
	if im.Applied != snap.GetApplied() {
		return fail("the tables applied %d entries, the snapshot says %d", im.Applied, snap.GetApplied())
	}
	if d := st.Digest(); !bytes.Equal(d[:], snap.GetDigest()) {
		return fail("the restored state's digest differs from the snapshot's (a damaged snapshot, or replicas of different gotrain versions)")
	}
	return st, nil
}
