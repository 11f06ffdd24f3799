package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Contact with the coordinator. A blip (a dropped link, a frozen switch, a
// coordinator host that stalls) must not end the job: when the watch
// stream breaks, the agent opens a new one, for up to the job's node
// timeout, and the coordinator (coordinator/reach.go) replaces the old
// stream with it; the workers run on meanwhile. A node that stays cut off
// for longer stops its own workers and says why (at most twice the node
// timeout after the cut), so that they neither hold
// their GPUs nor write checkpoints on forever: the coordinator has lost the
// node by then. Two signs of being cut off: the stream cannot be opened
// again, or the coordinator has not answered a progress report (one a
// second while ranks run) for the node timeout — a stream on a dead
// connection can look open for longer.

// rewatchEvery is the pause between attempts to open the watch stream again.
const rewatchEvery = 200 * time.Millisecond

// watch reads the coordinator's generation events into events until ctx
// ends, opening the stream again after a break; it sends on lost the error
// that ends contact for good.
func (a *agent) watch(ctx context.Context, stream gotrainv1.Coordinator_WatchGenerationsClient, events chan<- *gotrainv1.GenerationEvent, lost chan<- error, coordAddr string) {
	for {
		err := a.recvAll(ctx, stream, events)
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
		fmt.Fprintf(a.cfg.Stderr, "gotrain: lost contact with the coordinator at %s (%v); trying again for up to %s, the workers run on\n",
			coordAddr, status.Convert(err).Message(), a.nodeTimeout)
		a.rewatching.Store(true) // the loop's phase (launcher.go)
		stream, err = a.rewatch(ctx, err)
		a.rewatching.Store(false)
		if err != nil {
			if ctx.Err() == nil {
				lost <- err
			}
			return
		}
		fmt.Fprintf(a.cfg.Stderr, "gotrain: back in contact with the coordinator at %s\n", coordAddr)
	}
}

// recvAll passes the stream's events on until it ends; it returns why.
func (a *agent) recvAll(ctx context.Context, stream gotrainv1.Coordinator_WatchGenerationsClient, events chan<- *gotrainv1.GenerationEvent) error {
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
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
			return ctx.Err()
		}
	}
}

// rewatch opens the watch stream again, trying for the node timeout.
func (a *agent) rewatch(ctx context.Context, cause error) (gotrainv1.Coordinator_WatchGenerationsClient, error) {
	deadline := time.Now().Add(a.nodeTimeout)
	for {
		stream, err := a.coord.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.nodeID, AfterSeq: a.lastSeq.Load()})
		if err == nil {
			return stream, nil
		}
		if final(err) {
			return nil, err
		}
		if time.Now().After(deadline) {
			why := status.Convert(cause).Message()
			if _, last := a.hub.silence(time.Now()); last != nil {
				// The coordinator's last word on this node's heartbeat
				// (a replicated one says when there is no majority).
				why = status.Convert(last).Message()
			}
			return nil, fmt.Errorf("cut off for %s (%v), longer than the node timeout: the coordinator has lost this node", a.nodeTimeout, why)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(rewatchEvery):
		}
	}
}

// final says whether a stream's error ends contact for good: the job is
// over (the stream ended cleanly), the coordinator lost this node or does
// not know it, or the token is refused. Anything else may be a blip.
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
	silent, err := a.hub.silence(now)
	if silent < 2*a.nodeTimeout {
		return nil
	}
	return fmt.Errorf("cut off: no answer for %s (%v), longer than the node timeout: the coordinator has lost this node", silent.Round(100*time.Millisecond), status.Convert(err).Message())
}
