// Package reportq is the agent's queue of worker exit and park reports on
// their way to the coordinator.
//
// The queue never drops a report: a job whose ranks all exit at once must
// hear of every exit, or it waits forever for the ones that were lost. It is
// bounded by the ranks instead of by a fixed size: a rank has at most one
// exit and one park report waiting, because a newer report of the same kind
// for the same rank (a later process of it) makes the older one stale, so it
// replaces it.
package reportq

import (
	"sync"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

type key struct {
	rank   int32
	parked bool
}

// Queue is a first-in, first-out queue of reports, safe for concurrent use.
// The zero value is not usable; call New.
type Queue struct {
	mu      sync.Mutex
	order   []*gotrainv1.ReportWorkerExitRequest
	pending map[key]*gotrainv1.ReportWorkerExitRequest
	ready   chan struct{}
}

// New returns an empty queue.
func New() *Queue {
	return &Queue{pending: map[key]*gotrainv1.ReportWorkerExitRequest{}, ready: make(chan struct{}, 1)}
}

// Put adds req at the end. A waiting report of the same kind for the same
// rank is dropped from its place: req supersedes it. Put never blocks.
func (q *Queue) Put(req *gotrainv1.ReportWorkerExitRequest) {
	k := key{req.GetRank(), req.GetParked()}
	q.mu.Lock()
	if old, ok := q.pending[k]; ok {
		for i, r := range q.order {
			if r == old {
				q.order = append(q.order[:i], q.order[i+1:]...)
				break
			}
		}
	}
	q.pending[k] = req
	q.order = append(q.order, req)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Ready is signalled after a Put; TakeAll then returns what is waiting. A
// signal may come with nothing left to take.
func (q *Queue) Ready() <-chan struct{} { return q.ready }

// TakeAll removes and returns every waiting report, oldest first.
func (q *Queue) TakeAll() []*gotrainv1.ReportWorkerExitRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.order
	q.order = nil
	clear(q.pending)
	return out
}

// Len is the number of waiting reports.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}
