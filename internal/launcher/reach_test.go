package launcher

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
)

// The waiting line's reason, from real sockets: a name that does not
// resolve, a port where nothing listens, and a listener whose queue is full
// (the kernel drops the SYNs: no answer, as behind a firewall).
func TestProbeReachSaysWhy(t *testing.T) {
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := ln.Addr().String()
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	full := fullListener(t)

	if got := probeReach(ctx, []string{up}); got != "" {
		t.Errorf("a listening coordinator: %q, want nothing", got)
	}
	for _, tc := range []struct{ addr, want string }{
		{"gotrain-no-such-host.invalid:29400", "its name does not resolve (DNS"},
		{refused, "connection refused"},
		{full, "no answer (timeout)"},
	} {
		if got := probeReach(ctx, []string{tc.addr}); !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.addr, got, tc.want)
		}
	}
	got := probeReach(ctx, []string{up, refused})
	if !strings.HasPrefix(got, refused+": connection refused") || strings.Contains(got, up) {
		t.Errorf("replicas %s,%s: %q, want only %s's reason", up, refused, got, refused)
	}
}

// fullListener is an address whose accept queue is full: a listen backlog
// of 0 holds one connection, never accepted, and later SYNs are dropped.
func fullListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}).String()
	// Fill the queue: connections the kernel completes until it drops SYNs.
	for i := 0; i < 4; i++ {
		d := net.Dialer{Timeout: probeTimeout}
		c, err := d.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr
}

func TestUnreachableWhy(t *testing.T) {
	for msg, want := range map[string]string{
		`connection error: desc = "transport: Error while dialing: dial tcp: lookup x.invalid: no such host"`:          "DNS: no such host",
		"name resolver error: produced zero addresses":                                                                 "DNS: no such host",
		`connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`: "connection refused",
		"dial tcp 10.1.2.3:29400: i/o timeout":                                                                         "no answer (timeout)",
		"context deadline exceeded":                                                                                    "no answer (timeout)",
		"dial tcp 10.1.2.3:29400: connect: no route to host":                                                           "no route",
		"something else entirely":                                                                                      "something else entirely",
	} {
		if got := unreachableWhy(msg); !strings.Contains(got, want) {
			t.Errorf("unreachableWhy(%q) = %q, want %q", msg, got, want)
		}
	}
}
