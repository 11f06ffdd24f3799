package launcher

import (
	"fmt"
	"net"
	"os"

	"github.com/gotrain/gotrain/internal/netport"
)

// freePort returns a TCP port for rank 0 to bind later (MASTER_PORT): free
// now, and outside the kernel's ephemeral range so that no connection on
// the machine is given it meanwhile (netport). Another process binding the
// same fixed port can still take it; torchrun's MASTER_PORT has that race.
func freePort(host string) (int, error) { return netport.Unclaimed(host) }

// OutboundAddress returns an address other nodes can likely reach this one
// at: the first non-loopback IPv4 address of an interface that is up. A
// service listening on all interfaces advertises it to other nodes.
func OutboundAddress() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list network interfaces: %w", err)
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("no non-loopback IPv4 address found; pass --node-addr")
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
