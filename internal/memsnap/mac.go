package memsnap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The MAC of a snapshot that crosses nodes: HMAC-SHA256, by the job's
// snapshot key, of its rank, step, size, checksum and the checksum's name.
// The agent computes it when it keeps a worker's snapshot (its facts are
// the ones it checked the bytes against); a replica carries it, and an
// agent refuses a replica, or a fetched one, whose MAC fails. So a replica
// cannot be relabelled to another rank or a later step by anyone without
// the key. The key is not the job token's (every worker and every node that
// ever joined holds the token): the coordinator derives it from the job
// CA's key and hands it only to the nodes of the current generation
// (GenerationStarted.snapshot_key). The checksum is a CRC, not a digest:
// the bytes themselves are kept intact on the way by the peer port's TLS.

// ErrMAC: a snapshot's MAC is missing or does not match its facts.
var ErrMAC = errors.New("memsnap: the snapshot's MAC does not match (not written by an agent of this job, or relabelled)")

// MAC is the MAC by key of a snapshot's facts.
func MAC(key []byte, rank int, step, size int64, crc uint32, sum string) []byte {
	m := hmac.New(sha256.New, key)
	var b [8 + 8 + 8 + 4]byte
	binary.BigEndian.PutUint64(b[0:], uint64(int64(rank)))
	binary.BigEndian.PutUint64(b[8:], uint64(step))
	binary.BigEndian.PutUint64(b[16:], uint64(size))
	binary.BigEndian.PutUint32(b[24:], crc)
	m.Write([]byte("gotrain memsnap v1\x00"))
	m.Write(b[:])
	m.Write([]byte(sum))
	return m.Sum(nil)
}

// checkMAC is nil when mac is the MAC by key of the facts; key must not be
// empty.
func checkMAC(key []byte, rank int, step, size int64, crc uint32, sum string, mac []byte) error {
	if len(mac) == 0 {
		return fmt.Errorf("%w: rank %d's snapshot of step %d carries no MAC", ErrMAC, rank, step)
	}
	if !hmac.Equal(mac, MAC(key, rank, step, size, crc, sum)) {
		return fmt.Errorf("%w: rank %d's snapshot of step %d", ErrMAC, rank, step)
	}
	return nil
}
