package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/bench/internal/snapagent"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/memsnap"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// runPeer measures the peer tier over loopback TCP, as two agents would
// use it: replicate (a snapshot of one store to another agent's
// SnapshotPeer, mutual TLS 1.3 with node certificates and the proof of
// the token) and fetch (that agent's replica back into a sealed memfd,
// length and CRC-32C checked: what a replaced rank's agent hands its
// worker). Both agents are in this process; the bytes cross the kernel's
// TCP stack and TLS both ways.
func runPeer(size int64, reps, streams int) error {
	ctx := context.Background()
	ca, err := jobtls.NewCA("bench")
	if err != nil {
		return err
	}
	cert := func(node string) (tlsCert, error) {
		key, csr, err := jobtls.NewNodeKey()
		if err != nil {
			return tlsCert{}, err
		}
		der, err := ca.IssueNode(node, csr)
		return tlsCert{jobtls.NodeCertificate(der, key)}, err
	}
	recvCert, err := cert("node-2")
	if err != nil {
		return err
	}
	sendCert, err := cert("node-1")
	if err != nil {
		return err
	}
	// Both agents hold the job's snapshot key (the coordinator hands it
	// with each generation): replicas carry its MAC.
	key := []byte("memstate's snapshot key, 32 byte")
	receiver := memsnap.NewStore(0)
	receiver.SetKey(key)
	defer receiver.Close()
	conf, _ := jobtls.NodePeerTLS(ca.Cert, recvCert.c)
	srv := grpc.NewServer(append(memsnap.PeerServerOptions(), grpc.Creds(jobtls.ServerCredentials(conf, snapagent.Token)))...)
	gotrainv1.RegisterSnapshotPeerServer(srv, &memsnap.PeerServer{Store: receiver})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(lis)
	defer srv.Stop()
	_, client := jobtls.NodePeerTLS(ca.Cert, sendCert.c)
	// One connection for replicate and the one-stream fetch, and as many
	// as a replaced rank's agent opens for a ranged fetch (snaptier).
	var peers []gotrainv1.SnapshotPeerClient
	for range max(1, streams) {
		cc, err := grpc.NewClient(lis.Addr().String(), append(memsnap.PeerDialOptions(), grpc.WithTransportCredentials(jobtls.PeerCredentials(client("node-2"), snapagent.Token)))...)
		if err != nil {
			return err
		}
		defer cc.Close()
		peers = append(peers, gotrainv1.NewSnapshotPeerClient(cc))
	}
	peer := peers[0]

	// The sender's own snapshot, handed over as a worker does.
	sender := memsnap.NewStore(0)
	sender.SetKey(key)
	defer sender.Close()
	sock := filepath.Join(os.TempDir(), fmt.Sprintf("memstate-peer-%d.sock", os.Getpid()))
	sl, err := memsnap.Listen(sock)
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go (&memsnap.Server{Store: sender, Token: snapagent.Token}).Serve(sctx, sl)
	wc, err := memsnap.Dial(ctx, sock, snapagent.Token, 0)
	if err != nil {
		return err
	}
	defer wc.Close()
	b, err := memsnap.NewBuffer(size)
	if err != nil {
		return err
	}
	for i := range b.Bytes() {
		b.Bytes()[i] = byte(i * 7)
	}
	if err := wc.Commit(b, 1); err != nil {
		return err
	}
	snap, ok := sender.Acquire(0)
	if !ok {
		return fmt.Errorf("the sender's store holds no snapshot")
	}
	defer sender.Release(snap)

	var rep, fetch, ranged []time.Duration
	for range reps {
		start := time.Now()
		if err := memsnap.Replicate(ctx, peer, snap, "node-1", 1); err != nil {
			return fmt.Errorf("replicate: %w", err)
		}
		rep = append(rep, time.Since(start))
		start = time.Now()
		f, found, err := memsnap.FetchReplica(ctx, peer, 0, 1)
		if err != nil || !found {
			return fmt.Errorf("fetch: found %v, %w", found, err)
		}
		fetch = append(fetch, time.Since(start))
		_ = unix.Close(f.Fd)
		start = time.Now()
		f, found, err = memsnap.FetchReplicaOver(ctx, peers, 0, 1, snap.Step, snap.Size)
		if err != nil || !found {
			return fmt.Errorf("fetch over %d connections: found %v, %w", len(peers), found, err)
		}
		ranged = append(ranged, time.Since(start))
		_ = unix.Close(f.Fd)
	}
	gbps := func(d time.Duration) string { return fmt.Sprintf("%.2f GB/s", float64(size)/d.Seconds()/1e9) }
	fmt.Printf("peer tier, %d bytes, median of %d (loopback TCP, TLS 1.3, both agents in one process):\n", size, reps)
	fmt.Printf("  peer    replicate: %v = %s (send, receiver's memfd, CRC-32C check, keep)\n", med(rep), gbps(med(rep)))
	fmt.Printf("  peer    fetch:     %v = %s (receive into a memfd, seal, CRC-32C check)\n", med(fetch), gbps(med(fetch)))
	fmt.Printf("  peer    fetch over %d connections: %v = %s (a range each, into one memfd; seal, CRC-32C check)\n", len(peers), med(ranged), gbps(med(ranged)))
	return nil
}

type tlsCert struct{ c tls.Certificate }
