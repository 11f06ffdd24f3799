package cpucomm

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/gotrain/gotrain/worker/comm"
)

// Connection handshake. The acceptor (the lower rank) sends a challenge (a
// nonce); the dialer (the higher rank) answers with a hello, a nonce of its
// own and an HMAC proving the job token; the acceptor checks both and
// answers with its own rank, a status and an HMAC proving the token in turn.
// See doc.go.
const (
	helloMagic   = "GTCPUCM2" // the last byte is the wire version
	maxNameLen   = 1 << 10
	statusOK     = 0
	statusReject = 1
	nonceLen     = 32
	macLen       = sha256.Size
)

type hello struct {
	rank, size int
	generation int64
	name       string
	addr       string // the address the dialer listens on, for error messages
}

// writeChallenge sends the acceptor's magic and a fresh nonce, and returns
// the nonce.
func writeChallenge(w io.Writer) ([]byte, error) {
	b := make([]byte, 0, len(helloMagic)+nonceLen)
	b = append(b, helloMagic...)
	b = append(b, make([]byte, nonceLen)...)
	nonce := b[len(helloMagic):]
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	_, err := w.Write(b)
	return nonce, err
}

func readChallenge(r io.Reader) ([]byte, error) {
	var b [len(helloMagic) + nonceLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, err
	}
	if string(b[:len(helloMagic)]) != helloMagic {
		return nil, errNotPeer
	}
	return b[len(helloMagic):], nil
}

// mac is the HMAC-SHA256, keyed with the job token, of a handshake message:
// role names the side that sends it, so that one side's MAC is never
// accepted as the other's, and both nonces make it good for one connection.
func mac(token []byte, role string, acceptorNonce, dialerNonce, msg []byte) []byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte("gotrain cpucomm " + role + "\x00"))
	h.Write(acceptorNonce)
	h.Write(dialerNonce)
	h.Write(msg)
	return h.Sum(nil)
}

func encodeHello(h hello) []byte {
	b := make([]byte, 0, 8+4+4+8+2+len(h.name)+2+len(h.addr))
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.size))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.generation))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.name)))
	b = append(b, h.name...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.addr)))
	b = append(b, h.addr...)
	return b
}

// errNotPeer means the other side does not speak this protocol.
var errNotPeer = errors.New("cpucomm: not a gotrain cpucomm peer (bad magic)")

// readHello reads a hello and returns it with its bytes as they came.
func readHello(r io.Reader) (hello, []byte, error) {
	var raw bytes.Buffer
	h, err := readHelloFrom(io.TeeReader(r, &raw))
	return h, raw.Bytes(), err
}

func readHelloFrom(r io.Reader) (hello, error) {
	var b [8 + 4 + 4 + 8 + 2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return hello{}, err
	}
	if string(b[:8]) != helloMagic {
		return hello{}, errNotPeer
	}
	h := hello{
		rank:       int(int32(binary.LittleEndian.Uint32(b[8:]))),
		size:       int(int32(binary.LittleEndian.Uint32(b[12:]))),
		generation: int64(binary.LittleEndian.Uint64(b[16:])),
	}
	n := int(binary.LittleEndian.Uint16(b[24:]))
	var err error
	if h.name, err = readString(r, n); err != nil {
		return hello{}, err
	}
	var nb [2]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return hello{}, err
	}
	if h.addr, err = readString(r, int(binary.LittleEndian.Uint16(nb[:]))); err != nil {
		return hello{}, err
	}
	return h, nil
}

func readString(r io.Reader, n int) (string, error) {
	if n > maxNameLen {
		return "", fmt.Errorf("cpucomm: string of %d bytes in hello (at most %d)", n, maxNameLen)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func encodeReply(rank int, status byte, msg string) []byte {
	if len(msg) > maxNameLen {
		msg = msg[:maxNameLen]
	}
	b := make([]byte, 0, 8+4+1+2+len(msg))
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = append(b, status)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	return b
}

// readReply reads a reply and returns it with its bytes as they came.
func readReply(r io.Reader) (rank int, status byte, msg string, raw []byte, err error) {
	var b [8 + 4 + 1 + 2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, "", nil, err
	}
	if string(b[:8]) != helloMagic {
		return 0, 0, "", nil, errNotPeer
	}
	rank = int(int32(binary.LittleEndian.Uint32(b[8:])))
	status = b[12]
	n := int(binary.LittleEndian.Uint16(b[13:]))
	if n > maxNameLen {
		return 0, 0, "", nil, fmt.Errorf("cpucomm: reply reason of %d bytes (at most %d)", n, maxNameLen)
	}
	m := make([]byte, n)
	if _, err := io.ReadFull(r, m); err != nil {
		return 0, 0, "", nil, err
	}
	return rank, status, string(m), append(b[:], m...), nil
}

// kind names a collective on the wire and in errors.
type kind uint8

const (
	kindAllReduce kind = iota + 1
	kindBroadcast
	kindAllGather
	kindReduceScatter
	kindBarrier
)

var kindNames = [...]string{
	kindAllReduce:     "allreduce",
	kindBroadcast:     "broadcast",
	kindAllGather:     "allgather",
	kindReduceScatter: "reducescatter",
	kindBarrier:       "barrier",
}

func (k kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// The collective header, sent once per collective on every connection the
// collective uses, before its data:
//
//	0  uint32 headerMagic
//	4  uint8  kind
//	5  uint8  dtype
//	6  uint8  op
//	7  uint8  0
//	8  uint64 seq
//	16 uint64 count
//	24 int32  root (-1 when none)
//	28 uint32 0
const (
	headerLen   = 32
	headerMagic = 0x43435447 // "GTCC"
)

// call is one collective as this rank issued it.
type call struct {
	kind  kind
	seq   uint64
	dtype comm.DType
	op    comm.Op
	count int // allreduce, broadcast: elements; allgather, reducescatter: elements per rank
	root  int // broadcast root, else -1
	hdr   [headerLen]byte
}

func (k *call) encode() {
	h := k.hdr[:]
	binary.LittleEndian.PutUint32(h[0:], headerMagic)
	h[4], h[5], h[6], h[7] = byte(k.kind), byte(k.dtype), byte(k.op), 0
	binary.LittleEndian.PutUint64(h[8:], k.seq)
	binary.LittleEndian.PutUint64(h[16:], uint64(k.count))
	binary.LittleEndian.PutUint32(h[24:], uint32(int32(k.root)))
	binary.LittleEndian.PutUint32(h[28:], 0)
}

func decodeHeader(h []byte) (call, bool) {
	if binary.LittleEndian.Uint32(h) != headerMagic {
		return call{}, false
	}
	return call{
		kind:  kind(h[4]),
		dtype: comm.DType(h[5]),
		op:    comm.Op(h[6]),
		seq:   binary.LittleEndian.Uint64(h[8:]),
		count: int(binary.LittleEndian.Uint64(h[16:])),
		root:  int(int32(binary.LittleEndian.Uint32(h[24:]))),
	}, true
}

// short names the collective: "allreduce #12".
func (k *call) short() string { return fmt.Sprintf("%s #%d", k.kind, k.seq) }

// String describes the collective fully, for mismatch errors.
func (k *call) String() string {
	switch k.kind {
	case kindAllReduce:
		return fmt.Sprintf("%s (%s %s, %d elements)", k.short(), k.dtype, k.op, k.count)
	case kindBroadcast:
		return fmt.Sprintf("%s (%s, %d elements, root %d)", k.short(), k.dtype, k.count, k.root)
	case kindAllGather:
		return fmt.Sprintf("%s (%s, %d elements per rank)", k.short(), k.dtype, k.count)
	case kindReduceScatter:
		return fmt.Sprintf("%s (%s %s, %d elements per rank)", k.short(), k.dtype, k.op, k.count)
	}
	return k.short()
}

// closedByPeer reports whether err means the other side went away.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// peerError describes an I/O error on the connection to p during k.
func peerError(k *call, p *peer, dir string, err error) error {
	if closedByPeer(err) {
		return fmt.Errorf("cpucomm: rank %d (%s) closed the connection during %s: %w", p.rank, p.addr, k.short(), err)
	}
	return fmt.Errorf("cpucomm: %s: %s rank %d (%s): %w", k.short(), dir, p.rank, p.addr, err)
}

// peer is the connection to one other rank.
type peer struct {
	rank int
	addr string
	conn *net.TCPConn
	hdr  [headerLen]byte // the last collective header read from this peer
}
