//go:build linux

package memsnap

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// nodeCert issues node's certificate of ca.
func nodeCert(t *testing.T, ca *jobtls.CA, node string) tls.Certificate {
	t.Helper()
	key, csr, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueNode(node, csr)
	if err != nil {
		t.Fatal(err)
	}
	return jobtls.NodeCertificate(der, key)
}

// peerServer serves st's replicas as node "node-2" of ca over loopback and
// returns its address.
func peerServer(t *testing.T, ca *jobtls.CA, st *Store) string {
	t.Helper()
	conf, _ := jobtls.NodePeerTLS(ca.Cert, nodeCert(t, ca, "node-2"))
	srv := grpc.NewServer(grpc.Creds(jobtls.ServerCredentials(conf, testToken)))
	gotrainv1.RegisterSnapshotPeerServer(srv, &PeerServer{Store: st})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// peerClient dials addr as node of ca with tok.
func peerClient(t *testing.T, ca, of *jobtls.CA, addr, tok string) gotrainv1.SnapshotPeerClient {
	t.Helper()
	_, client := jobtls.NodePeerTLS(ca.Cert, nodeCert(t, of, "node-1"))
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(jobtls.PeerCredentials(client("node-2"), tok)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return gotrainv1.NewSnapshotPeerClient(cc)
}

// testKey is the tests' job snapshot key (mac.go).
var testKey = []byte("the job's snapshot key, 32 bytes")

// keyedStore is a store of limit bytes with testKey, closed when t ends.
func keyedStore(t *testing.T, limit int64) *Store {
	t.Helper()
	st := NewStore(limit)
	st.SetKey(testKey)
	t.Cleanup(st.Close)
	return st
}

// ownSnapshot commits data as rank's snapshot of step in st and returns it.
func ownSnapshot(t *testing.T, st *Store, rank int, step int64, data []byte) *Snapshot {
	t.Helper()
	b, err := NewBuffer(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes(), data)
	unmap(b.data)
	s, err := st.Commit(rank, step, b.fd, int64(len(data)), Checksum(data), SourceOwn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A replica crosses mutual TLS with the proof of the token, bytes and step
// intact, in several chunks; the receiver keeps it apart from its own
// snapshots and serves it back (Have, Fetch), and counts it against its
// limit.
func TestReplicateAndFetch(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	sender, receiver := keyedStore(t, 0), keyedStore(t, 8<<20)
	c := peerClient(t, ca, ca, peerServer(t, ca, receiver), testToken)
	ctx := t.Context()

	data := bytes.Repeat([]byte("gotrain!"), (3*ChunkSize+123)/8)
	s := ownSnapshot(t, sender, 1, 7, data)
	ownSnapshot(t, receiver, 1, 99, []byte("the receiver's own rank 1")) // a rank numbered 1 here too: kept apart
	if err := Replicate(ctx, c, s, "node-1", 1); err != nil {
		t.Fatalf("replicate: %v", err)
	}
	if own, _ := receiver.Acquire(1); own.Step != 99 {
		t.Errorf("the receiver's own snapshot of rank 1 is of step %d, want 99 (a replica must not replace it)", own.Step)
	}
	info, err := c.Have(ctx, &gotrainv1.PeerSnapshotRequest{Rank: 1})
	if err != nil || !info.GetFound() || info.GetStep() != 7 || info.GetSize() != int64(len(data)) {
		t.Fatalf("Have(1) = %v, %v; want step 7 of %d bytes", info, err, len(data))
	}
	f, found, err := FetchReplica(ctx, c, 1, 1)
	if err != nil || !found || f.Step != 7 {
		t.Fatalf("FetchReplica(1) = %+v, %v, %v", f, found, err)
	}
	got, err := mapReadOnly(f.Fd, f.Size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) || !sealed(f.Fd) {
		t.Errorf("the fetched replica differs from the snapshot sent, or is not sealed")
	}
	unmap(got)
	closeFd(f.Fd)
	if _, found, err := FetchReplica(ctx, c, 5, 1); found || err != nil {
		t.Errorf("FetchReplica of a rank without a replica: found %v, %v", found, err)
	}

	// Over the limit (8 MiB, of which 3 MiB are held): refused before the bytes travel.
	big := ownSnapshot(t, sender, 2, 8, make([]byte, 6<<20))
	err = Replicate(ctx, c, big, "node-1", 1)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--snapshot-memory") {
		t.Errorf("a replica over the limit: %v, want ResourceExhausted naming --snapshot-memory", err)
	}
}

// A replica cut off mid-stream, or with a wrong checksum, never replaces
// the last complete one.
func TestPartialReplicaKeepsThePrevious(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	receiver := keyedStore(t, 0)
	c := peerClient(t, ca, ca, peerServer(t, ca, receiver), testToken)
	sender := keyedStore(t, 0)
	data := bytes.Repeat([]byte{1}, 2*ChunkSize)
	if err := Replicate(t.Context(), c, ownSnapshot(t, sender, 0, 10, data), "node-1", 1); err != nil {
		t.Fatal(err)
	}

	// Step 11: one chunk of two, then the stream ends.
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := c.Replicate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gotrainv1.SnapshotChunk{Rank: 0, Step: 11, Size: int64(len(data)), Crc: Checksum(data), Data: data[:ChunkSize],
		Mac: MAC(testKey, 0, 11, int64(len(data)), Checksum(data), "")}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.CloseAndRecv()
	cancel()
	if status.Code(err) != codes.DataLoss {
		t.Errorf("a replica with half its bytes: %v, want DataLoss", err)
	}
	// Step 12: every byte, a wrong checksum.
	stream, err = c.Replicate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&gotrainv1.SnapshotChunk{Rank: 0, Step: 12, Size: int64(len(data)), Crc: Checksum(data) + 1, Data: data,
		Mac: MAC(testKey, 0, 12, int64(len(data)), Checksum(data)+1, "")})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.DataLoss {
		t.Errorf("a replica with a wrong checksum: %v, want DataLoss", err)
	}
	if s, ok := receiver.AcquireReplica(0); !ok || s.Step != 10 {
		t.Fatalf("after two torn replicas the receiver holds %v, want step 10", s)
	}
}

// Only the job's agents get in: a wrong token, or a node certificate of
// another job's CA, is refused before any call.
func TestPeerNeedsTokenAndNodeCertificate(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	other, err := jobtls.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	st := NewStore(0)
	t.Cleanup(st.Close)
	addr := peerServer(t, ca, st)
	for name, c := range map[string]gotrainv1.SnapshotPeerClient{
		"wrong token":       peerClient(t, ca, ca, addr, "not-the-token"),
		"another CA's node": peerClient(t, ca, other, addr, testToken),
	} {
		if _, err := c.Have(t.Context(), &gotrainv1.PeerSnapshotRequest{Rank: 0}); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: Have = %v, want the connection refused (Unavailable)", name, err)
		}
	}
}

// A large replica comes over several connections at once, each a range of
// it, into one memfd, sealed and checked as a whole: the bytes the sender
// had. A range of a step the peer no longer holds is answered as "not
// found" (ask again), never stitched into another step's bytes.
func TestFetchReplicaOverSeveralConnections(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	sender, receiver := keyedStore(t, 0), keyedStore(t, 0)
	addr := peerServer(t, ca, receiver)
	var cs []gotrainv1.SnapshotPeerClient
	for range 3 {
		cs = append(cs, peerClient(t, ca, ca, addr, testToken))
	}
	ctx := t.Context()
	data := make([]byte, fetchRangeFrom+3*ChunkSize+5) // uneven ranges
	for i := range data {
		data[i] = byte(i*31 + i>>13)
	}
	if err := Replicate(ctx, cs[0], ownSnapshot(t, sender, 3, 12, data), "node-1", 1); err != nil {
		t.Fatal(err)
	}
	f, found, err := FetchReplicaOver(ctx, cs, 3, 1, 12, int64(len(data)))
	if err != nil || !found || f.Step != 12 || f.Size != int64(len(data)) {
		t.Fatalf("FetchReplicaOver = %+v, %v, %v", f, found, err)
	}
	got, err := mapReadOnly(f.Fd, f.Size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) || !sealed(f.Fd) {
		t.Error("the replica fetched in ranges differs from the snapshot sent, or is not sealed")
	}
	unmap(got)
	closeFd(f.Fd)
	if _, found, err := FetchReplicaOver(ctx, cs, 3, 1, 11, int64(len(data))); found || err != nil {
		t.Errorf("ranges of a step the peer no longer holds: found %v, %v; want not found", found, err)
	}
}
