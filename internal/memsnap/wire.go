package memsnap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// SocketName is the snapshot socket's name in the agent's private socket
// directory, beside the gRPC socket the workers attach to.
const SocketName = "snapshot.sock"

// SocketFor returns the snapshot socket of the agent whose gRPC socket is
// agentSocket (GOTRAIN_AGENT).
func SocketFor(agentSocket string) string {
	return filepath.Join(filepath.Dir(agentSocket), SocketName)
}

// maxMessage bounds one message on the socket: requests and replies are a
// few hundred bytes of JSON; the state itself travels as a descriptor.
const maxMessage = 4096

// Operations a worker asks for.
const (
	opHello  = "hello"  // Token, Rank, Pid: the first message of a connection
	opPut    = "put"    // Step, Size, CRC, with the memfd
	opLatest = "latest" // the rank's newest complete snapshot
)

// request is a worker's message.
type request struct {
	Op    string `json:"op"`
	Token string `json:"token,omitempty"`
	Rank  int    `json:"rank"`
	Pid   int    `json:"pid,omitempty"`
	Step  int64  `json:"step,omitempty"`
	Size  int64  `json:"size,omitempty"`
	CRC   uint32 `json:"crc,omitempty"`
	// Reuse says the worker keeps the memfd to write a later snapshot into
	// once this one is replaced: the agent does not seal it, and every
	// reader checks the checksum (double buffering by the worker).
	Reuse bool `json:"reuse,omitempty"`
	// Sum names the checksum: "" for CRC-32C, "crc32" for CRC-32 (IEEE),
	// which Python's standard library has (zlib.crc32), SumByAgent when
	// the worker leaves it to the agent (CRC out of the training step's
	// path).
	Sum string `json:"sum,omitempty"`
	// Format names the snapshot's layout when the agent can check it
	// (FormatPython); "" for a Go worker's opaque bytes.
	Format string `json:"format,omitempty"`
}

// reply is the agent's answer; a latest that found a snapshot carries its
// memfd.
type reply struct {
	Err    string `json:"err,omitempty"`
	Found  bool   `json:"found,omitempty"`
	Step   int64  `json:"step,omitempty"`
	Size   int64  `json:"size,omitempty"`
	CRC    uint32 `json:"crc,omitempty"`
	Source string `json:"source,omitempty"`
	Sealed bool   `json:"sealed,omitempty"`
	Sum    string `json:"sum,omitempty"`
}

// errMessage is a message that is not one this protocol sends.
var errMessage = errors.New("memsnap: malformed message")

// send writes v as one packet, with fd (when ≥ 0) as SCM_RIGHTS.
func send(c *net.UnixConn, v any, fd int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("%w: %d bytes", errMessage, len(b))
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("memsnap: short write (%d of %d bytes)", n, len(b))
	}
	return nil
}

// recv reads one packet into v and returns the descriptor it carried, or
// -1. More than one descriptor, a truncated packet or bad JSON is an error
// (every descriptor received is closed then).
func recv(c *net.UnixConn, v any) (int, error) {
	buf := make([]byte, maxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, err
	}
	fds, ferr := parseRights(oob[:oobn])
	bad := func(err error) (int, error) {
		for _, fd := range fds {
			closeFd(fd)
		}
		return -1, err
	}
	switch {
	case ferr != nil:
		return bad(fmt.Errorf("%w: %v", errMessage, ferr))
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > maxMessage:
		return bad(fmt.Errorf("%w: longer than %d bytes or too many descriptors", errMessage, maxMessage))
	case n == 0:
		return bad(errors.New("memsnap: the connection closed"))
	case len(fds) > 1:
		return bad(fmt.Errorf("%w: %d descriptors", errMessage, len(fds)))
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		return bad(fmt.Errorf("%w: %v", errMessage, err))
	}
	if len(fds) == 1 {
		return fds[0], nil
	}
	return -1, nil
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, r...)
	}
	return fds, nil
}
