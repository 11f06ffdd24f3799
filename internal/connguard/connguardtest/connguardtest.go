// Package connguardtest floods a port with silent connections and counts
// those it keeps open, for the tests of every port's bounds.
package connguardtest

import (
	"io"
	"net"
	"testing"
	"time"
)

// Flood opens n silent TCP connections to addr from the local address src
// (closed when t ends) and returns them.
func Flood(t testing.TB, src, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %s from %s: %v", addr, src, err)
		}
		conns = append(conns, c)
	}
	return conns
}

// StillOpen polls until at most max of conns are still open (the server
// closed the others: they read EOF), giving up after d, and returns how
// many are open.
func StillOpen(conns []net.Conn, max int, d time.Duration) int {
	open := conns
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		var left []net.Conn
		for _, c := range open {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
			if _, err := io.Copy(io.Discard, c); err != nil { // a timeout: still open
				left = append(left, c)
			}
		}
		open = left
		if len(open) <= max || time.Now().After(deadline) {
			return len(open)
		}
	}
}
