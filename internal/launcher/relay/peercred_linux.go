package relay

import (
	"net"

	"golang.org/x/sys/unix"
)

// connPeer returns the process at the other end of a unix socket
// connection, as the kernel recorded it when the peer connected.
func connPeer(conn net.Conn) (pid, uid, gid int, ok bool) {
	if w, wrapped := conn.(interface{ NetConn() net.Conn }); wrapped { // connguard's
		conn = w.NetConn()
	}
	uc, isUnix := conn.(*net.UnixConn)
	if !isUnix {
		return 0, 0, 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, 0, false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		return 0, 0, 0, false
	}
	return int(cred.Pid), int(cred.Uid), int(cred.Gid), true
}
