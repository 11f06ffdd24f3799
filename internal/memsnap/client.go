package memsnap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// ErrNone is Latest's answer when neither the agent nor a peer holds a
// snapshot of the rank.
var ErrNone = errors.New("memsnap: no snapshot of this rank in memory")

// Client is a worker's connection to its agent's snapshot socket. Its
// methods are safe for concurrent use; requests are answered in order.
type Client struct {
	rank int
	mu   sync.Mutex
	conn *net.UnixConn
}

// Dial connects to the snapshot socket at path as rank, proving the job
// token; the agent checks that this process is the worker it started as
// rank.
func Dial(ctx context.Context, path, token string, rank int) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("rank %d: connect to the agent's snapshot socket %s: %w", rank, path, err)
	}
	c := &Client{rank: rank, conn: nc.(*net.UnixConn)}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
		defer c.conn.SetDeadline(time.Time{})
	}
	var rep reply
	if fd, err := c.call(request{Op: opHello, Token: token, Rank: rank, Pid: os.Getpid()}, -1, &rep); err != nil || fd >= 0 {
		closeFd(fd)
		c.conn.Close()
		if err == nil {
			err = errors.New("the agent's hello answer carried a descriptor")
		}
		return nil, fmt.Errorf("rank %d: hello to the agent's snapshot socket: %w", rank, err)
	}
	if rep.Err != "" {
		c.conn.Close()
		return nil, fmt.Errorf("rank %d: the agent refused the snapshot connection: %s", rank, rep.Err)
	}
	return c, nil
}

// Close ends the connection; the agent keeps what was committed.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) call(req request, fd int, rep *reply) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := send(c.conn, req, fd); err != nil {
		return -1, err
	}
	return recv(c.conn, rep)
}

// Buffer is shared memory a snapshot is written into before Commit hands
// it to the agent.
type Buffer struct {
	fd   int
	data []byte
}

// NewBuffer returns a buffer of size bytes, its pages allocated.
func NewBuffer(size int64) (*Buffer, error) {
	fd, err := createMemfd("gotrain-snapshot", size)
	if err != nil {
		return nil, err
	}
	data, err := mapWritable(fd, size)
	if err != nil {
		closeFd(fd)
		return nil, err
	}
	return &Buffer{fd: fd, data: data}, nil
}

// Bytes is the buffer's memory, to write the state into.
func (b *Buffer) Bytes() []byte { return b.data }

// Size is the buffer's length.
func (b *Buffer) Size() int64 { return int64(len(b.data)) }

// Discard frees a buffer that will not be committed.
func (b *Buffer) Discard() {
	unmap(b.data)
	closeFd(b.fd)
	b.data, b.fd = nil, -1
}

// Commit hands b to the agent as the rank's snapshot of step; b is used up
// either way. It returns once the agent has checked and kept it, or said
// why not (ErrTooLarge, ErrTorn in the message).
func (c *Client) Commit(b *Buffer, step int64) error {
	defer b.Discard()
	size := int64(len(b.data))
	crc := Checksum(b.data)
	// The writable mapping must be gone before the agent seals the memfd.
	unmap(b.data)
	b.data = nil
	var rep reply
	if _, err := c.call(request{Op: opPut, Rank: c.rank, Step: step, Size: size, CRC: crc}, b.fd, &rep); err != nil {
		return fmt.Errorf("rank %d: hand the snapshot of step %d to the agent: %w", c.rank, step, err)
	}
	if rep.Err != "" {
		return fmt.Errorf("rank %d: the agent did not keep the snapshot of step %d: %s", c.rank, step, rep.Err)
	}
	return nil
}

// CommitReused hands b to the agent as the rank's snapshot of step and
// keeps it: the caller writes a later snapshot into it only after the
// agent has kept another one in its place (alternating two buffers), so
// the pages are written once per snapshot and never faulted in again. The
// agent does not seal it; it and every reader check the checksum.
func (c *Client) CommitReused(b *Buffer, step int64) error {
	size := int64(len(b.data))
	var rep reply
	if _, err := c.call(request{Op: opPut, Rank: c.rank, Step: step, Size: size, CRC: Checksum(b.data), Reuse: true}, b.fd, &rep); err != nil {
		return fmt.Errorf("rank %d: hand the snapshot of step %d to the agent: %w", c.rank, step, err)
	}
	if rep.Err != "" {
		return fmt.Errorf("rank %d: the agent did not keep the snapshot of step %d: %s", c.rank, step, rep.Err)
	}
	return nil
}

// Restored is a snapshot read back from memory: a read-only mapping of the
// pages the agent (or a peer) holds.
type Restored struct {
	Step   int64
	Source string // SourceOwn or SourcePeer
	data   []byte
}

// Bytes returns the snapshot (read-only; valid until Close).
func (r *Restored) Bytes() []byte { return r.data }

// Close unmaps the snapshot.
func (r *Restored) Close() {
	unmap(r.data)
	r.data = nil
}

// Latest returns the rank's newest complete snapshot, from the agent's
// memory or a peer's; ErrNone when there is none. Its length is checked
// again here, and its checksum unless the memfd is sealed (checked by the
// agent once sealed, and then immutable).
func (c *Client) Latest() (*Restored, error) {
	var rep reply
	fd, err := c.call(request{Op: opLatest, Rank: c.rank}, -1, &rep)
	if err != nil {
		return nil, fmt.Errorf("rank %d: ask the agent for its snapshot: %w", c.rank, err)
	}
	defer closeFd(fd)
	switch {
	case rep.Err != "":
		return nil, fmt.Errorf("rank %d: the agent could not serve its snapshot: %s", c.rank, rep.Err)
	case !rep.Found:
		return nil, ErrNone
	case fd < 0:
		return nil, fmt.Errorf("rank %d: the agent's snapshot answer carried no memfd", c.rank)
	}
	if rep.Sealed && !sealed(fd) {
		return nil, fmt.Errorf("%w: rank %d's snapshot of step %d is not sealed", ErrTorn, c.rank, rep.Step)
	}
	if n, err := fileSize(fd); err != nil || n != rep.Size {
		return nil, fmt.Errorf("%w: rank %d's snapshot of step %d holds %d bytes, the agent says %d (%v)", ErrTorn, c.rank, rep.Step, n, rep.Size, err)
	}
	data, err := mapReadOnly(fd, rep.Size)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", c.rank, err)
	}
	if rep.Sealed {
		// The agent checked it after it was sealed, and the kernel lets
		// no one change a sealed memfd: checking it again would only
		// double a large restore's time.
		return &Restored{Step: rep.Step, Source: rep.Source, data: data}, nil
	}
	got, err := checksumBy(rep.Sum, data)
	if err != nil {
		unmap(data)
		return nil, fmt.Errorf("rank %d: %w", c.rank, err)
	}
	if got != rep.CRC {
		unmap(data)
		return nil, fmt.Errorf("%w: rank %d's snapshot of step %d has CRC-32C %08x, the agent says %08x", ErrTorn, c.rank, rep.Step, got, rep.CRC)
	}
	return &Restored{Step: rep.Step, Source: rep.Source, data: data}, nil
}
