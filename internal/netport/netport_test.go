package netport

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// The port is below the ephemeral range, outside the reserved ones, and
// free: it can be bound right after.
func TestUnclaimedIsBelowTheEphemeralRangeAndFree(t *testing.T) {
	low := ephemeralLow()
	if low-lowest < 1000 {
		t.Skipf("this machine's ephemeral range starts at %d: no room below it (Unclaimed falls back to :0)", low)
	}
	for range 50 {
		p, err := Unclaimed("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if p < lowest || p >= low || (p >= reserved[0] && p < reserved[1]) {
			t.Fatalf("Unclaimed = %d; want in [%d, %d) outside [%d, %d)", p, lowest, low, reserved[0], reserved[1])
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("bind the port Unclaimed returned: %v", err)
		}
		l.Close()
	}
}

// A bad host is an error that names it.
func TestUnclaimedBadHost(t *testing.T) {
	_, err := Unclaimed("203.0.113.250")
	if err == nil || !strings.Contains(err.Error(), "203.0.113.250") {
		t.Fatalf("Unclaimed on an address this machine does not have: %v; want an error naming it", err)
	}
}
