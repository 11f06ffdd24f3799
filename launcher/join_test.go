package launcher

import (
	"net"
	"testing"
)

func TestJoinAddress(t *testing.T) {
	for _, tc := range []struct {
		lis  *net.TCPAddr
		node string
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 29400}, "10.0.0.1", "10.0.0.1:29400"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 29400}, "10.0.0.1", "10.0.0.1:29400"},
		{&net.TCPAddr{IP: net.ParseIP("192.168.1.5"), Port: 1234}, "10.0.0.1", "192.168.1.5:1234"},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 41000}, "127.0.0.1", "127.0.0.1:41000"},
		{&net.TCPAddr{IP: net.IPv6zero, Port: 29400}, "fd00::1", "[fd00::1]:29400"},
	} {
		if got := joinAddress(tc.lis, tc.node); got != tc.want {
			t.Errorf("joinAddress(%s, %s) = %s, want %s", tc.lis, tc.node, got, tc.want)
		}
	}
}

// A short --job-token is the coordinator's business (it refuses a wrong
// one); deriving the run id from it must not panic.
func TestShortJobTokenRunID(t *testing.T) {
	c := Config{Coordinator: "127.0.0.1:29400", NodeAddress: "127.0.0.1", JobToken: "abc"}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.RunID != "gotrain-abc" {
		t.Errorf("run id %q", c.RunID)
	}
}
