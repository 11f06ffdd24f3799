//go:build linux

package memsnap

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Issue N3: a replica of a higher step beat the rank's own snapshot in
// latest (after the next restart the job "finished" with planted state).
// The own snapshot wins whatever step a replica claims; a replica is
// served only when the rank has no own snapshot here (it moved here).
func TestReplicaNeverOutranksTheOwnSnapshot(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	sender, receiver := keyedStore(t, 0), keyedStore(t, 0)
	c := peerClient(t, ca, ca, peerServer(t, ca, receiver), testToken)
	sock := serve(t, &Server{Store: receiver, Token: testToken})

	ownSnapshot(t, receiver, 0, 5, bytes.Repeat([]byte{5}, 1<<20))
	for rank, step := range map[int]int64{0: 1000, 1: 900} {
		if err := Replicate(t.Context(), c, ownSnapshot(t, sender, rank, step, []byte("planted")), "node-1", 1); err != nil {
			t.Fatalf("replicate rank %d: %v", rank, err)
		}
	}
	wantStep(t, sock, 5) // rank 0: its own, step 5, not the replica's 1000
	r, err := latest(t, sock, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Step != 900 || r.Source != SourcePeer {
		t.Errorf("rank 1, with no own snapshot here: got step %d from %q, want the replica's 900", r.Step, r.Source)
	}
}

// Item 1 (agent side): a replica must carry the MAC of its facts by the
// job's snapshot key. One MACed by another key, relabelled to a later step
// or another rank, or carrying none, is refused and nothing is kept; so is
// every replica at an agent that has no key yet. A fetched replica is
// checked again by the agent that fetched it (CheckFetched).
func TestForgedMACIsRefused(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	receiver := keyedStore(t, 0)
	c := peerClient(t, ca, ca, peerServer(t, ca, receiver), testToken)
	data := []byte("training state")
	crc := Checksum(data)
	send := func(rank int32, step int64, mac []byte) error {
		stream, err := c.Replicate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(&gotrainv1.SnapshotChunk{Rank: rank, Step: step, Size: int64(len(data)), Crc: crc, Data: data, Mac: mac})
		_, err = stream.CloseAndRecv()
		return err
	}
	for name, err := range map[string]error{
		"MAC by another key":             send(0, 7, MAC([]byte("a key the job never had, 32 by."), 0, 7, int64(len(data)), crc, "")),
		"step 7's MAC relabelled as 8":   send(0, 8, MAC(testKey, 0, 7, int64(len(data)), crc, "")),
		"rank 0's MAC relabelled as 1":   send(1, 7, MAC(testKey, 0, 7, int64(len(data)), crc, "")),
		"no MAC":                         send(0, 7, nil),
		"a MAC over another size/crc":    send(0, 7, MAC(testKey, 0, 7, 1, crc+1, "")),
		"the MAC under another checksum": send(0, 7, MAC(testKey, 0, 7, int64(len(data)), crc, SumIEEE)),
	} {
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "MAC") {
			t.Errorf("%s: %v, want PermissionDenied naming the MAC", name, err)
		}
	}
	if got := receiver.List(); len(got) != 0 {
		t.Fatalf("the receiver kept %v after forged replicas", got)
	}
	if err := send(0, 7, MAC(testKey, 0, 7, int64(len(data)), crc, "")); err != nil {
		t.Fatalf("the replica with the job key's MAC: %v", err)
	}

	// An agent without the key cannot tell: it refuses.
	keyless := NewStore(0)
	t.Cleanup(keyless.Close)
	kc := peerClient(t, ca, ca, peerServer(t, ca, keyless), testToken)
	if err := Replicate(t.Context(), kc, ownSnapshot(t, keyedStore(t, 0), 0, 1, data), "node-1", 1); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a replica at an agent without a key: %v, want PermissionDenied", err)
	}

	// Two agents of another key (a node that left with its key, or made
	// its own) serve a replica: the fetching agent refuses it.
	evilSender, evilHolder := NewStore(0), NewStore(0)
	t.Cleanup(evilSender.Close)
	t.Cleanup(evilHolder.Close)
	evilKey := []byte("not the job's snapshot key......")
	evilSender.SetKey(evilKey)
	evilHolder.SetKey(evilKey)
	ec := peerClient(t, ca, ca, peerServer(t, ca, evilHolder), testToken)
	if err := Replicate(t.Context(), ec, ownSnapshot(t, evilSender, 2, 99, data), "node-1", 1); err != nil {
		t.Fatal(err)
	}
	f, found, err := FetchReplica(t.Context(), ec, 2, 1)
	if err != nil || !found {
		t.Fatalf("fetch: %v, %v", found, err)
	}
	if err := receiver.CheckFetched(2, f); !errors.Is(err, ErrMAC) {
		t.Errorf("a fetched replica MACed by another key: %v, want ErrMAC", err)
	}
}

// receivingBytes is what the store counts of replicas in flight.
func receivingBytes(st *Store) int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	var n int64
	for _, r := range st.receiving {
		n += r.got
	}
	return n
}

// Issue N3: Replicate streams reserved their claimed size up front and were
// checked only against what the store held, so several streams in flight
// took 1.84 GB under a 400 MiB --snapshot-memory. Now the bytes count as
// they arrive, in-flight ones included: a stream that would take the store
// over its limit is cut (RESOURCE_EXHAUSTED naming --snapshot-memory) while
// the others are still open, one that claims more than the limit is refused
// before its bytes travel, and a second sender of a rank is refused.
func TestReplicasBoundedAsTheyArrive(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	const limit = 8 << 20
	receiver := keyedStore(t, limit)
	c := peerClient(t, ca, ca, peerServer(t, ca, receiver), testToken)
	size := int64(6 << 20)
	data := make([]byte, size)
	crc := Checksum(data)
	open := func(rank int32) gotrainv1.SnapshotPeer_ReplicateClient {
		stream, err := c.Replicate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return stream
	}
	chunk := func(rank int32, off int64) *gotrainv1.SnapshotChunk {
		ch := &gotrainv1.SnapshotChunk{Data: data[off : off+ChunkSize]}
		if off == 0 {
			ch.Rank, ch.Step, ch.Size, ch.Crc, ch.Mac = rank, 1, size, crc, MAC(testKey, int(rank), 1, size, crc, "")
		}
		return ch
	}
	waitReceiving := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); receivingBytes(receiver) < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the receiver counts %d bytes in flight, want %d", receivingBytes(receiver), n)
			}
		}
	}

	// Rank 0 and rank 1 each claim 6 MiB, which alone fits, and each send
	// 1 MiB: both in flight (2 MiB counted, none reserved).
	s0, s1 := open(0), open(1)
	if err := s0.Send(chunk(0, 0)); err != nil {
		t.Fatal(err)
	}
	waitReceiving(1 << 20)
	if err := s1.Send(chunk(1, 0)); err != nil {
		t.Fatal(err)
	}
	waitReceiving(2 << 20)
	// Rank 0 goes on to 5 of its 6 MiB; its stream stays open.
	for off := int64(ChunkSize); off < 5<<20; off += ChunkSize {
		if err := s0.Send(chunk(0, off)); err != nil {
			t.Fatal(err)
		}
	}
	waitReceiving(6 << 20)
	if h := receiver.Held(); h != 0 {
		t.Errorf("the store holds %d bytes while a replica is in flight; want 0", h)
	}
	// A second sender of rank 0 is refused while the first is in flight.
	dup := open(0)
	_ = dup.Send(chunk(0, 0))
	if _, err := dup.CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Errorf("a second replica of rank 0 in flight: %v, want Aborted", err)
	}
	// Rank 1 goes on: cut once its bytes and rank 0's in flight pass
	// 8 MiB.
	for off := int64(ChunkSize); off < size; off += ChunkSize {
		if s1.Send(chunk(1, off)) != nil {
			break // cut: CloseAndRecv says why
		}
	}
	if _, err := s1.CloseAndRecv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--snapshot-memory") {
		t.Fatalf("rank 1's replica with rank 0's 5 MiB in flight under an 8 MiB limit: %v, want ResourceExhausted naming --snapshot-memory", err)
	}
	// Rank 0 completes and is kept.
	if err := s0.Send(chunk(0, 5<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := s0.CloseAndRecv(); err != nil {
		t.Fatalf("rank 0's replica: %v", err)
	}
	if h := receiver.Held(); h != size {
		t.Errorf("held %d bytes, want rank 0's %d", h, size)
	}
	if n := receivingBytes(receiver); n != 0 {
		t.Errorf("%d bytes still counted in flight after both streams ended", n)
	}

	// A third rank's claim while 6 MiB are held: refused before any byte
	// beyond the first chunk is taken; so is a claim beyond the limit.
	big := open(2)
	_ = big.Send(&gotrainv1.SnapshotChunk{Rank: 2, Step: 1, Size: 1 << 30, Crc: crc, Data: data[:ChunkSize], Mac: MAC(testKey, 2, 1, 1<<30, crc, "")})
	if _, err := big.CloseAndRecv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a replica claiming 1 GiB under an 8 MiB limit: %v, want ResourceExhausted", err)
	}
	third := open(3)
	_ = third.Send(chunk(3, 0))
	if _, err := third.CloseAndRecv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a replica claiming 6 MiB with 6 of 8 MiB held: %v, want ResourceExhausted", err)
	}
}
