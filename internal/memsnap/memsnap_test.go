//go:build linux

package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const testToken = "test-token"

// The child modes of the test binary: a real worker process that writes a
// snapshot and then exits or is killed.
func TestMain(m *testing.M) {
	if mode := os.Getenv("MEMSNAP_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child connects as rank 0 and commits step MEMSNAP_STEP filled with its
// byte; in mode "die-mid-write" it writes half of it and SIGKILLs itself.
func child(mode string) int {
	step, _ := strconv.ParseInt(os.Getenv("MEMSNAP_STEP"), 10, 64)
	c, err := Dial(context.Background(), os.Getenv("MEMSNAP_SOCKET"), testToken, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, err := NewBuffer(1 << 20)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fill := b.Bytes()
	if mode == "die-mid-write" {
		fill = fill[:len(fill)/2]
	}
	for i := range fill {
		fill[i] = byte(step)
	}
	if mode == "die-mid-write" {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := c.Commit(b, step); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0 // exits without Close: the agent must keep it anyway
}

// serve starts a server for st on a socket in a fresh directory.
func serve(t *testing.T, srv *Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), SocketName)
	lis, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return sock
}

func runChild(t *testing.T, sock, mode string, step int64) error {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEMSNAP_CHILD="+mode, "MEMSNAP_SOCKET="+sock, "MEMSNAP_STEP="+strconv.FormatInt(step, 10))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if err != nil && errb.Len() > 0 {
		return fmt.Errorf("%w: %s", err, errb.String())
	}
	return err
}

func latest(t *testing.T, sock string, rank int) (*Restored, error) {
	t.Helper()
	c, err := Dial(t.Context(), sock, testToken, rank)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Latest()
}

func wantStep(t *testing.T, sock string, step int64) {
	t.Helper()
	r, err := latest(t, sock, 0)
	if err != nil {
		t.Fatalf("latest: %v", err)
	}
	defer r.Close()
	if r.Step != step || r.Source != SourceOwn || len(r.Bytes()) != 1<<20 {
		t.Fatalf("got step %d from %q, %d bytes; want step %d from the agent, %d bytes", r.Step, r.Source, len(r.Bytes()), step, 1<<20)
	}
	for i, b := range r.Bytes() {
		if b != byte(step) {
			t.Fatalf("byte %d is %d, want %d", i, b, byte(step))
		}
	}
}

// A snapshot outlives the process that wrote it, and the newest complete
// one is served; a writer SIGKILLed mid-write leaves the previous one.
func TestSnapshotOutlivesWriterAndPartialIsNeverServed(t *testing.T) {
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	if _, err := latest(t, sock, 0); !errors.Is(err, ErrNone) {
		t.Fatalf("latest before any snapshot: %v, want ErrNone", err)
	}
	for _, step := range []int64{3, 4} {
		if err := runChild(t, sock, "commit", step); err != nil {
			t.Fatalf("the writer of step %d: %v", step, err)
		}
		wantStep(t, sock, step)
	}
	err := runChild(t, sock, "die-mid-write", 5)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the writer that dies mid-write: %v, want killed by SIGKILL", err)
	}
	wantStep(t, sock, 4)
	if got := st.Held(); got != 1<<20 {
		t.Errorf("the store holds %d bytes, want one snapshot's %d", got, 1<<20)
	}
}

// putRaw hands fd over as a snapshot without Commit's care.
func putRaw(t *testing.T, sock string, fd int, step, size int64, crc uint32) string {
	t.Helper()
	c, err := Dial(t.Context(), sock, testToken, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var rep reply
	out, err := c.call(request{Op: opPut, Rank: 0, Step: step, Size: size, CRC: crc}, fd, &rep)
	closeFd(out)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Err
}

// Each way a snapshot can be torn is refused, and the previous one stays.
func TestTornSnapshotsAreRefused(t *testing.T) {
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	if err := runChild(t, sock, "commit", 7); err != nil {
		t.Fatal(err)
	}
	mk := func(fillWith byte) (*Buffer, uint32) {
		b, err := NewBuffer(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b.Bytes() {
			b.Bytes()[i] = fillWith
		}
		return b, Checksum(b.Bytes())
	}
	cases := []struct {
		name string
		put  func() string
		want string
	}{
		{"wrong checksum", func() string {
			b, crc := mk(8)
			unmap(b.data)
			defer closeFd(b.fd)
			return putRaw(t, sock, b.fd, 8, 1<<20, crc^1)
		}, "CRC-32C"},
		{"shorter than claimed", func() string {
			b, crc := mk(8)
			unmap(b.data)
			defer closeFd(b.fd)
			return putRaw(t, sock, b.fd, 8, 2<<20, crc)
		}, "claims"},
		{"still mapped writable by the worker", func() string {
			b, crc := mk(8)
			defer b.Discard()
			return putRaw(t, sock, b.fd, 8, 1<<20, crc)
		}, "seal"},
		{"not a memfd", func() string {
			f, err := os.CreateTemp(t.TempDir(), "state")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			return putRaw(t, sock, int(f.Fd()), 8, 0, Checksum(nil))
		}, "seal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.put()
			if !strings.Contains(got, c.want) {
				t.Errorf("the agent answered %q, want a refusal naming %q", got, c.want)
			}
			wantStep(t, sock, 7)
		})
	}
}

// --snapshot-memory bounds what the store holds; replacing a rank's own
// snapshot counts only the new one.
func TestMemoryLimit(t *testing.T) {
	st := NewStore(3 << 20)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	put := func(rank int, size int64) error {
		c, err := Dial(t.Context(), sock, testToken, rank)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b, err := NewBuffer(size)
		if err != nil {
			t.Fatal(err)
		}
		return c.Commit(b, 1)
	}
	if err := put(0, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := put(0, 3<<20); err != nil {
		t.Fatalf("replacing rank 0's snapshot with one the limit holds: %v", err)
	}
	err := put(1, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "--snapshot-memory") || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("a snapshot over the limit: %v, want an error naming rank 1 and --snapshot-memory", err)
	}
	if got := st.Held(); got != 3<<20 {
		t.Errorf("held %d bytes, want %d", got, 3<<20)
	}
}

// Only the job's token and the process the agent started as the rank get in.
func TestHelloIsChecked(t *testing.T) {
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken, Authorize: func(_ context.Context, pid, rank int) error {
		if pid != os.Getpid() || rank != 2 {
			return fmt.Errorf("pid %d is not rank %d's worker", pid, rank)
		}
		return nil
	}})
	if _, err := Dial(t.Context(), sock, "wrong", 2); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("a wrong token: %v, want refused", err)
	}
	if _, err := Dial(t.Context(), sock, testToken, 1); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("another rank: %v, want refused", err)
	}
	c, err := Dial(t.Context(), sock, testToken, 2)
	if err != nil {
		t.Fatalf("the rank itself: %v", err)
	}
	c.Close()
	// A connection that lies about its pid.
	nc, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := send(nc.(*net.UnixConn), request{Op: opHello, Token: testToken, Rank: 2, Pid: 1}, -1); err != nil {
		t.Fatal(err)
	}
	var rep reply
	if _, err := recv(nc.(*net.UnixConn), &rep); err != nil || !strings.Contains(rep.Err, "comes from pid") {
		t.Errorf("a hello with another pid: %+v %v, want refused", rep, err)
	}
}

// Malformed packets end the connection without taking anything.
func TestMalformedMessages(t *testing.T) {
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	for _, msg := range [][]byte{[]byte("not json"), bytes.Repeat([]byte("x"), maxMessage+10)} {
		nc, err := net.Dial("unixpacket", sock)
		if err != nil {
			t.Fatal(err)
		}
		uc := nc.(*net.UnixConn)
		if _, _, err := uc.WriteMsgUnix(msg, nil, nil); err != nil {
			t.Fatal(err)
		}
		var rep reply
		_, err = recv(uc, &rep)
		if err == nil && rep.Err == "" {
			t.Errorf("%.20q: accepted", msg)
		}
		nc.Close()
	}
	// Two descriptors in one put.
	c, err := Dial(t.Context(), sock, testToken, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := make([]int, 2)
	if err := unix.Pipe(p); err != nil {
		t.Fatal(err)
	}
	defer closeFd(p[0])
	defer closeFd(p[1])
	b, _ := jsonPut()
	if _, _, err := c.conn.WriteMsgUnix(b, unix.UnixRights(p[0], p[1]), nil); err != nil {
		t.Fatal(err)
	}
	var rep reply
	if _, err := recv(c.conn, &rep); err == nil {
		t.Errorf("a put with two descriptors was answered: %+v", rep)
	}
	if len(st.List()) != 0 {
		t.Errorf("the store took something: %+v", st.List())
	}
}

func jsonPut() ([]byte, error) { return []byte(`{"op":"put","step":1,"size":0}`), nil }

// Double buffering by the worker (CommitReused): two buffers written in
// turn are served in turn; one written to while the agent serves it (what
// the protocol forbids) fails the reader's checksum check and is never
// handed out as a state.
func TestReusedBuffersAlternateAndATornOneIsRefused(t *testing.T) {
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	c, err := Dial(t.Context(), sock, testToken, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var bufs [2]*Buffer
	for i := range bufs {
		if bufs[i], err = NewBuffer(1 << 20); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Discard()
	}
	for step := int64(1); step <= 4; step++ {
		b := bufs[step%2]
		for i := range b.Bytes() {
			b.Bytes()[i] = byte(step)
		}
		if err := c.CommitReused(b, step); err != nil {
			t.Fatal(err)
		}
		wantStep(t, sock, step)
	}
	bufs[0].Bytes()[12345] ^= 0xff // step 4's buffer, which the agent serves
	if _, err := latest(t, sock, 0); !errors.Is(err, ErrTorn) && (err == nil || !strings.Contains(err.Error(), "CRC-32C")) {
		t.Fatalf("a served buffer changed under the agent: %v, want refused by its checksum", err)
	}
}

// A snapshot in a memfd its worker keeps (CommitReused) is checked by
// every reader while the worker maps it; once the worker is gone the agent
// seals it and checks it once more, and a restore then reads it without a
// second pass. One the worker changed after the hand-over is never served.
func TestReusedSnapshotSealedOnceItsWriterIsGone(t *testing.T) {
	for _, changed := range []bool{false, true} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			st := NewStore(0)
			defer st.Close()
			sock := serve(t, &Server{Store: st, Token: testToken})
			c, err := Dial(t.Context(), sock, testToken, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			b, err := NewBuffer(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			for i := range b.Bytes() {
				b.Bytes()[i] = 5
			}
			if err := c.CommitReused(b, 5); err != nil {
				t.Fatal(err)
			}
			// The worker still maps it: served, not sealed, checked by the reader.
			r, err := c.Latest()
			if err != nil {
				t.Fatalf("latest while the writer maps it: %v", err)
			}
			r.Close()
			if s, _ := st.Acquire(0); s.Sealed {
				t.Fatal("sealed while its worker still maps it writable")
			} else {
				st.Release(s)
			}
			if changed {
				b.Bytes()[100] = 6 // a buggy worker writes the served buffer
			}
			b.Discard() // the worker is gone: no writable mapping is left
			r, err = latest(t, sock, 0)
			if changed {
				if err == nil || !errors.Is(err, ErrTorn) && !strings.Contains(err.Error(), "after the hand-over") {
					t.Fatalf("latest of a snapshot changed after its hand-over: %v, want it refused", err)
				}
				if _, ok := st.Acquire(0); ok {
					t.Error("the changed snapshot is still held")
				}
				return
			}
			if err != nil {
				t.Fatalf("latest once the writer is gone: %v", err)
			}
			defer r.Close()
			if r.Step != 5 || len(r.Bytes()) != 1<<20 || r.Bytes()[100] != 5 {
				t.Fatalf("got step %d, %d bytes", r.Step, len(r.Bytes()))
			}
			s, _ := st.Acquire(0)
			defer st.Release(s)
			if !s.Sealed || !sealed(s.fd) {
				t.Error("not sealed once its writer is gone")
			}
		})
	}
}
