package memsnap

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
)

// Server serves the store on the agent's snapshot socket.
type Server struct {
	Store *Store
	// Token is the job token every hello must carry.
	Token string
	// Authorize says whether the process pid (as the kernel tells it) may
	// read and write rank's snapshots: the agent lets only the worker it
	// started as that rank. nil lets any process of this user that holds
	// the token (tests).
	Authorize func(ctx context.Context, pid, rank int) error
	// Fetch, when set, is asked for a rank's snapshot that the store does
	// not hold (a peer's replica); it returns a sealed memfd and its facts
	// (FetchReplica), or found false.
	Fetch func(ctx context.Context, rank int) (f Fetched, found bool, err error)
	// Committed, when set, is called after each snapshot a worker hands
	// over, before the worker hears that it was kept (peer replication:
	// a worker that waited for its hand-over knows its peer holds it too).
	Committed func(ctx context.Context, s *Snapshot)
	Log       *slog.Logger
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// Listen opens the snapshot socket at path.
func Listen(path string) (*net.UnixListener, error) {
	_ = os.Remove(path)
	lis, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on the snapshot socket %s: %w", path, err)
	}
	return lis, nil
}

// Serve answers connections on lis until ctx ends; it closes lis.
func (s *Server) Serve(ctx context.Context, lis *net.UnixListener) error {
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var wg sync.WaitGroup
	conns := map[*net.UnixConn]struct{}{}
	var mu sync.Mutex
	stop := context.AfterFunc(ctx, func() {
		lis.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	defer wg.Wait()
	for {
		c, err := lis.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept on the snapshot socket: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { mu.Lock(); delete(conns, c); mu.Unlock(); c.Close() }()
			if err := s.serveConn(ctx, c); err != nil {
				log.Warn("snapshot socket: a worker's connection ended", "err", err)
			}
		}()
	}
}

// serveConn answers one worker: a hello, then puts and latests for the
// rank it is.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn) error {
	var hello request
	fd, err := recv(c, &hello)
	closeFd(fd)
	if err != nil {
		return err
	}
	rank, err := s.checkHello(ctx, c, hello)
	if err != nil {
		_ = send(c, reply{Err: err.Error()}, -1)
		return err
	}
	if err := send(c, reply{}, -1); err != nil {
		return err
	}
	for {
		var req request
		fd, err := recv(c, &req)
		if err != nil {
			if errors.Is(err, errMessage) {
				return err
			}
			return nil // the worker went away
		}
		var rep reply
		var out = -1
		switch req.Op {
		case opPut:
			if fd < 0 {
				rep.Err = "put without a memfd"
				break
			}
			var check func([]byte) error
			switch req.Format {
			case "":
			case FormatPython:
				check = func(b []byte) error { return checkPythonSnapshot(b, rank, req.Step) }
			default:
				closeFd(fd)
				rep.Err = fmt.Sprintf("a snapshot in format %q, which this agent does not know (a gotrain_snapshot module newer than the agent?)", req.Format)
			}
			if rep.Err != "" {
				break
			}
			snap, err := s.Store.CommitChecked(rank, req.Step, fd, req.Size, req.CRC, req.Sum, SourceOwn, req.Reuse, check)
			if err != nil {
				rep.Err = err.Error()
				break
			}
			rep.Step, rep.Size, rep.CRC, rep.Found = snap.Step, snap.Size, snap.CRC, true
			if s.Committed != nil {
				s.Committed(ctx, snap)
			}
		case opLatest:
			closeFd(fd)
			rep, out = s.latest(ctx, rank)
		default:
			closeFd(fd)
			rep.Err = fmt.Sprintf("unknown operation %q", req.Op)
		}
		err = send(c, rep, out)
		closeFd(out)
		if err != nil {
			return nil
		}
	}
}

// latest answers with rank's newest snapshot: the store's own, else the
// replica it holds for a peer node (the rank moved here: its node was lost
// and the ranks were numbered again); else a peer's. A replica never
// outranks an own snapshot, whatever step it claims: a peer node's word
// must not replace what a worker here wrote.
func (s *Server) latest(ctx context.Context, rank int) (reply, int) {
	own, okOwn := s.Store.Acquire(rank)
	rep, okRep := s.Store.AcquireReplica(rank)
	if okOwn {
		defer s.Store.Release(own)
	}
	if okRep {
		defer s.Store.Release(rep)
	}
	snap := own
	if okRep && !okOwn {
		snap = rep
		s.log().Info("a rank restores from the replica a peer node sent here", "rank", rank, "step", rep.Step, "bytes", rep.Size)
	}
	if snap != nil {
		// Sealed (its worker gone), the reader need not check it again:
		// a restore reads it once, at memory speed.
		isSealed, err := s.Store.Seal(snap)
		if err != nil {
			return reply{Err: err.Error()}, -1
		}
		fd, err := dupFd(snap.fd)
		if err != nil {
			return reply{Err: fmt.Sprintf("duplicate rank %d's snapshot: %v", rank, err)}, -1
		}
		return reply{Found: true, Step: snap.Step, Size: snap.Size, CRC: snap.CRC, Source: snap.Source, Sealed: isSealed, Sum: snap.Sum}, fd
	}
	if s.Fetch != nil {
		f, found, err := s.Fetch(ctx, rank)
		switch {
		case err != nil:
			return reply{Err: fmt.Sprintf("rank %d's snapshot from a peer: %v", rank, err)}, -1
		case found:
			return reply{Found: true, Step: f.Step, Size: f.Size, CRC: f.CRC, Source: SourcePeer, Sealed: true, Sum: f.Sum}, f.Fd
		}
	}
	return reply{}, -1
}

// checkHello verifies the token and that the connected process may act as
// the rank it names.
func (s *Server) checkHello(ctx context.Context, c *net.UnixConn, h request) (int, error) {
	if h.Op != opHello {
		return 0, fmt.Errorf("%w: the first message is %q, not a hello", errMessage, h.Op)
	}
	if subtle.ConstantTimeCompare([]byte(h.Token), []byte(s.Token)) != 1 {
		return 0, errors.New("memsnap: the hello's job token is not this job's")
	}
	pid := peerPid(c)
	if pid != 0 && h.Pid != pid {
		return 0, fmt.Errorf("memsnap: the hello claims pid %d but comes from pid %d", h.Pid, pid)
	}
	if s.Authorize != nil {
		if err := s.Authorize(ctx, h.Pid, h.Rank); err != nil {
			return 0, fmt.Errorf("memsnap: pid %d may not keep rank %d's snapshots: %w", h.Pid, h.Rank, err)
		}
	}
	return h.Rank, nil
}
