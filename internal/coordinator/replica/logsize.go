package replica

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// The log's size. Every replica holds its log in memory, so its size per
// job is bounded, in bytes and not only in entries: an entry is at most
// MaxEntryBytes (Propose refuses a larger one), and once the log holds
// more than MaxLogBytes the replica snapshots its state and Raft drops the
// entries the snapshot covers, keeping only the newest — as many as fit
// in a quarter of MaxLogBytes, at most trailingLogs — for followers that
// lag a little (one that lags more gets the snapshot). Raft's own
// snapshots (every snapshotThreshold entries, checked every
// snapshotInterval) compact a log of many small entries the same way.
const (
	DefaultMaxLogBytes   = 64 << 20
	DefaultMaxEntryBytes = 4<<20 + 64<<10 // a 4 MiB request and its envelope
	snapshotThreshold    = 8192
	snapshotInterval     = 10 * time.Second
	trailingLogs         = 1024
)

// ErrEntryTooLarge: Propose was given an entry over Config.MaxEntryBytes.
var ErrEntryTooLarge = errors.New("replica: entry too large for the log")

// LogStats is what a replica's log holds now.
type LogStats struct {
	// FirstIndex and LastIndex are the log's oldest and newest entries (0
	// when empty); Entries how many it holds and Bytes their data.
	FirstIndex, LastIndex uint64
	Entries               int
	Bytes                 int64
	// Snapshots counts the snapshots this replica took for the log's size.
	Snapshots int
}

// sizedLog is Raft's log store (in memory) counting the bytes it holds;
// it calls over, without blocking, each time they pass the bound.
type sizedLog struct {
	s     *raft.InmemStore
	bound int64
	over  func()

	mu      sync.Mutex
	bytes   int64
	entries int
}

var _ raft.LogStore = (*sizedLog)(nil)

func logBytes(l *raft.Log) int64 { return int64(len(l.Data) + len(l.Extensions)) }

func (s *sizedLog) FirstIndex() (uint64, error)            { return s.s.FirstIndex() }
func (s *sizedLog) LastIndex() (uint64, error)             { return s.s.LastIndex() }
func (s *sizedLog) GetLog(index uint64, l *raft.Log) error { return s.s.GetLog(index, l) }
func (s *sizedLog) StoreLog(l *raft.Log) error             { return s.StoreLogs([]*raft.Log{l}) }

func (s *sizedLog) StoreLogs(logs []*raft.Log) error {
	s.mu.Lock()
	for _, l := range logs {
		var old raft.Log
		if s.s.GetLog(l.Index, &old) == nil { // overwritten: a follower's log repaired
			s.bytes -= logBytes(&old)
			s.entries--
		}
	}
	err := s.s.StoreLogs(logs)
	if err == nil {
		for _, l := range logs {
			s.bytes += logBytes(l)
			s.entries++
		}
	}
	over := s.bytes > s.bound
	s.mu.Unlock()
	if over {
		s.over()
	}
	return err
}

func (s *sizedLog) DeleteRange(min, max uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var freed int64
	n := 0
	for i := min; i <= max; i++ {
		var l raft.Log
		if s.s.GetLog(i, &l) == nil {
			freed += logBytes(&l)
			n++
		}
	}
	if err := s.s.DeleteRange(min, max); err != nil {
		return err
	}
	s.bytes -= freed
	s.entries -= n
	return nil
}

// trailing is how many of the newest entries to keep at the next
// compaction: as many as fit in a quarter of the bound, at most
// trailingLogs.
func (s *sizedLog) trailing() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, err := s.s.LastIndex()
	if err != nil {
		return 0
	}
	var sum int64
	n := uint64(0)
	for i := last; i > 0 && n < trailingLogs; i-- {
		var l raft.Log
		if s.s.GetLog(i, &l) != nil {
			break
		}
		if sum += logBytes(&l); sum > s.bound/4 {
			break
		}
		n++
	}
	return n
}

func (s *sizedLog) stats() LogStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, _ := s.s.FirstIndex()
	last, _ := s.s.LastIndex()
	return LogStats{FirstIndex: first, LastIndex: last, Entries: s.entries, Bytes: s.bytes}
}

// compactLoop snapshots the state each time the log passed its bound
// (n.compact), keeping the entries that fit (sizedLog.trailing), until the
// replica stops.
func (n *Node) compactLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case <-n.compact:
		}
		if err := n.compactNow(); err != nil {
			n.log.Debug("compact the coordinator's log", "replica", n.id, "err", err)
		}
	}
}

func (n *Node) compactNow() error {
	rc := n.r.ReloadableConfig()
	keep := rc
	keep.TrailingLogs = n.logs.trailing()
	if err := n.r.ReloadConfig(keep); err != nil {
		return fmt.Errorf("trailing logs %d: %w", keep.TrailingLogs, err)
	}
	// Raft's own snapshots keep the usual trailing entries again.
	defer func() { _ = n.r.ReloadConfig(rc) }()
	err := n.r.Snapshot().Error()
	if err == nil {
		n.mu.Lock()
		n.snapshots++
		n.mu.Unlock()
	}
	return err
}

// LogStats says what this replica's log holds now.
func (n *Node) LogStats() LogStats {
	st := n.logs.stats()
	n.mu.Lock()
	st.Snapshots = n.snapshots
	n.mu.Unlock()
	return st
}
