package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Contact with the coordinator. A blip (a dropped link, a frozen switch, a
// coordinator host that stalls) must not end the job: when the watch
// stream breaks, the agent opens a new one, for up to the job's node
// timeout, and the coordinator (internal/coordinator/reach.go) replaces the old
// stream with it; the workers run on meanwhile. A node that stays cut off
// for longer stops its own workers and says why (at most twice the node
// timeout after the cut), so that they neither hold
// their GPUs nor write checkpoints on forever: the coordinator has lost the
// node by then. Two signs of being cut off: the stream cannot be opened
// again, or the coordinator has not answered a progress report (one a
// second while ranks run) for the node timeout — a stream on a dead
// connection can look open for longer (watch says when a stream that
// opened counts as contact). The report of a node that gives up on a
// replicated coordinator says what each replica last said, and "no
// majority" when a majority is down or leaderless (leaderconn.NoMajority),
// whichever replica the last call happened to reach.

// rewatchEvery is the pause between attempts to open the watch stream again.
const rewatchEvery = 200 * time.Millisecond

// watch reads the coordinator's generation events into events until ctx
// ends, opening the stream again after a break; it sends on lost the error
// that ends contact for good.
//
// A stream that opens is not yet contact: into a partition it opens
// locally, and breaks again when the connection moves on to another
// replica. Contact is back once the coordinator answers this node's
// heartbeat after the stream opened, or sends an event on it; until then
// the time out of contact runs on from the first break (lostAt): a node
// that cannot open a stream at all gives up one node timeout after it, one
// whose streams open unanswered (a partition, where the coordinator may
// notice late and a blip must not end the job) two node timeouts after it,
// as the heartbeat's silence does (cutOff), unless every replica refuses
// once the partition heals (the job ended elsewhere and the coordinator is
// gone).
func (a *agent) watch(ctx context.Context, stream gotrainv1.Coordinator_WatchGenerationsClient, events chan<- *gotrainv1.GenerationEvent, lost chan<- error, coordAddr string) {
	opened, confirmed := time.Now(), true // the first stream came after Join's answer
	var lostAt time.Time
	unanswered := false // a stream opened since lostAt, unanswered
	stop := func() {}   // ends the stream's context
	defer func() { stop() }()
	for {
		got, err := a.recvAll(ctx, stream, events)
		if ctx.Err() != nil {
			return
		}
		if final(err) {
			lost <- err
			return
		}
		if a.lc != nil && len(a.lc.Addrs()) > 1 {
			// Replicated: a leader change ends the stream too.
			coordAddr = "its replicas " + strings.Join(a.lc.Addrs(), ",")
		}
		if confirmed || got || a.hub.AnsweredSince(opened) {
			lostAt, unanswered = time.Now(), false
			fmt.Fprintf(a.cfg.Stderr, "gotrain: lost contact with the coordinator at %s (%v); trying again for up to %s, the workers run on\n",
				coordAddr, status.Convert(err).Message(), a.nodeTimeout)
		}
		stop()
		var next func()
		a.rewatching.Store(true) // the loop's phase (launcher.go)
		stream, next, err = a.rewatch(ctx, err, lostAt, unanswered)
		a.rewatching.Store(false)
		if err != nil {
			if ctx.Err() == nil {
				lost <- err
			}
			return
		}
		stop = next
		opened = time.Now()
		// A heartbeat now says whether the coordinator hears this node.
		a.hub.Flush(ctx)
		if confirmed = a.hub.AnsweredSince(opened); confirmed {
			fmt.Fprintf(a.cfg.Stderr, "gotrain: back in contact with the coordinator at %s\n", coordAddr)
			continue
		}
		// Not yet. The connection, looking for a leader, reopens a stream
		// that got nothing among the replicas on its own: it ends at the
		// bound unless the coordinator has answered by then.
		unanswered = true
		at := opened
		end := a.endOnDeadline(lostAt, true, func() bool { return a.hub.AnsweredSince(at) }, next)
		stop = func() { end(); next() }
	}
}

// recvAll passes the stream's events on until it ends; it returns why,
// and whether any event came.
func (a *agent) recvAll(ctx context.Context, stream gotrainv1.Coordinator_WatchGenerationsClient, events chan<- *gotrainv1.GenerationEvent) (bool, error) {
	for got := false; ; got = true {
		ev, err := stream.Recv()
		if err != nil {
			return got, err
		}
		a.lastSeq.Store(ev.GetSeq()) // a new stream starts after it
		if r := ev.GetReplicas(); r != nil {
			a.learnReplicas(r.GetAddrs()) // replicas.go
			continue
		}
		if ev.GetHostReplica() != nil {
			a.replaceReplica(ctx) // replicas.go
			continue
		}
		select {
		case events <- ev:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

// rewatch opens the watch stream again until contactDeadline: one node
// timeout after lostAt, when contact was lost, or two when streams opened
// since (unanswered) — unless every replica now refuses the connection:
// the coordinator is gone, which no blip explains. stop ends the stream.
// An attempt is cut short at the deadline too: the connection may look for
// a leader among the replicas for longer.
func (a *agent) rewatch(ctx context.Context, cause error, lostAt time.Time, unanswered bool) (_ gotrainv1.Coordinator_WatchGenerationsClient, stop func(), _ error) {
	for {
		if time.Now().After(a.contactDeadline(lostAt, unanswered)) {
			return nil, nil, a.cutOffFor(lostAt, cause)
		}
		sctx, cancel := context.WithCancel(ctx)
		end := a.endOnDeadline(lostAt, unanswered, nil, cancel)
		stream, err := a.coord.WatchGenerations(sctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.nodeID, AfterSeq: a.lastSeq.Load(), Stream: a.streams.Add(1)})
		end()
		if err == nil && sctx.Err() == nil {
			return stream, cancel, nil
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case final(err):
			return nil, nil, err
		case len(a.replicaSet()) <= 1 && restarted(err) != nil: // keys.go: a new identity, not a blip
			return nil, nil, restarted(err)
		case err != nil:
			cause = err
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(rewatchEvery):
		}
	}
}

// contactDeadline is when a node out of contact since lostAt gives up:
// one node timeout after, two when streams opened since, unanswered (see
// watch) — unless every replica refuses the connection by now.
func (a *agent) contactDeadline(lostAt time.Time, unanswered bool) time.Time {
	if unanswered && (a.lc == nil || !leaderconn.AllRefused(a.lc.Replicas(), lostAt)) {
		return lostAt.Add(2 * a.nodeTimeout)
	}
	return lostAt.Add(a.nodeTimeout)
}

// endOnDeadline calls cancel once contactDeadline passes, looking every
// rewatchEvery (the deadline comes nearer when every replica refuses),
// unless answered (when not nil) says contact is back first; stop ends the
// watch.
func (a *agent) endOnDeadline(lostAt time.Time, unanswered bool, answered func() bool, cancel func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(rewatchEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if answered != nil && answered() {
				return
			}
			if time.Now().After(a.contactDeadline(lostAt, unanswered)) {
				cancel()
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// cutOffFor is why a node out of contact since lostAt, the last error
// cause, stops: no majority of the replicas, or the coordinator's last
// word on this node's heartbeat.
func (a *agent) cutOffFor(lostAt time.Time, cause error) error {
	if v := a.noMajority(lostAt); v != nil {
		return fmt.Errorf("cut off for %s, longer than the node timeout: %w; %s", time.Since(lostAt).Round(100*time.Millisecond), v, noMajorityHint)
	}
	why := status.Convert(cause).Message()
	if _, last := a.hub.Silence(time.Now()); last != nil {
		why = status.Convert(last).Message() // the coordinator's last word on this node's heartbeat
	}
	return fmt.Errorf("cut off for %s (%v), longer than the node timeout: the coordinator has lost this node", time.Since(lostAt).Round(100*time.Millisecond), why)
}

// final says whether a stream's error ends contact for good: the job is
// over (the stream ended cleanly), the coordinator lost this node or does
// not know it, or the token is refused. Anything else may be a blip; so
// is a stream superseded by a newer one of this node (ALREADY_EXISTS: the
// coordinator serves the highest-numbered, and this agent opens another).
func final(err error) bool {
	if errors.Is(err, io.EOF) {
		return true
	}
	switch status.Code(err) {
	case codes.Aborted, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
		return true
	}
	return false
}

// cutOff says, once the coordinator has not answered this node's progress
// reports for the node timeout, why the node must stop its workers; nil
// while it answers.
func (a *agent) cutOff(now time.Time) error {
	// Before this node's first generation there are no workers to stop,
	// and a coordinator swamped by a large rendezvous (128 agents joining
	// on 2 cores) may be slow to answer: the watch stream and the join
	// timeout speak for contact then.
	if a.nodeTimeout <= 0 || a.gen == nil {
		return nil
	}
	// Twice the node timeout: a coordinator that is merely slow (128
	// agents on 2 cores time out their reports for seconds) keeps the node
	// while its stream is attached, and the node must not stop its workers
	// first; one that has lost the node did so after one node timeout.
	silent, err := a.hub.Silence(now)
	if silent < 2*a.nodeTimeout {
		return nil
	}
	if v := a.noMajority(now.Add(-silent)); v != nil {
		return fmt.Errorf("cut off: no answer for %s, longer than the node timeout: %w; %s", silent.Round(100*time.Millisecond), v, noMajorityHint)
	}
	return fmt.Errorf("cut off: no answer for %s (%v), longer than the node timeout: the coordinator has lost this node", silent.Round(100*time.Millisecond), status.Convert(err).Message())
}

// noMajority is the verdict on a replicated coordinator from what each of
// its replicas said since contact was lost (leaderconn.NoMajority): it
// does not depend on which replica the last call happened to go to, nor
// on whether a surviving replica had concluded "no majority" yet. nil for
// a single coordinator, or while a replica answers as the leader.
func (a *agent) noMajority(since time.Time) error {
	if a.lc == nil {
		return nil
	}
	return leaderconn.NoMajority(a.lc.Replicas(), since)
}

// noMajorityHint is what to do when no majority of the replicas answers.
const noMajorityHint = "the job cannot go on from this node (bring back the lost replicas' hosts, or this node's network, and restart the job)"

// droppedStraggler returns, when the coordinator ended this node's stream
// because it dropped the node as a persistent straggler (--on-straggler
// replace under --nnodes MIN:MAX), why: the job goes on without it, and
// the node has not lost the coordinator.
func droppedStraggler(err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Aborted || !strings.Contains(st.Message(), "dropped as a persistent straggler") {
		return "", false
	}
	why := st.Message()
	if _, rest, ok := strings.Cut(why, "this node was lost ("); ok {
		why, _, _ = strings.Cut(rest, "); its workers must stop")
	}
	return why, true
}
