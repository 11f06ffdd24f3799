// Package netport picks TCP ports for a service that binds them later: a
// rendezvous port handed to another process (MASTER_PORT for rank 0's
// TCPStore) is probed free now and bound seconds after.
//
// A port from the kernel's ephemeral range (what a :0 listener gets) is the
// wrong choice for that: while it waits, any outbound connection on the
// machine may be given it as its local port, and the later bind fails with
// "address already in use" (seen in CI with many tests dialing at once).
// Below that range the kernel hands out nothing by itself; only another
// process binding a fixed port can collide. No library does this small
// job, hence this package.
package netport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// rangeFile holds the kernel's ephemeral port range: "32768\t60999".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowest is the lowest port Unclaimed picks: below it live the well-known
// and registered services a machine is likely to run.
const lowest = 20000

// reserved are ports Unclaimed never picks: gotrain's coordinator (29400)
// and the torchrun/PyTorch defaults (29500) with their neighbours.
var reserved = [2]int{29400, 29600}

// tries bounds the probes before Unclaimed falls back to a :0 port.
const tries = 64

// Unclaimed returns a TCP port on host that is free now and that the
// kernel does not hand out to connections by itself: one below the
// ephemeral range when the range leaves room below it, else (a range
// starting low, as some clusters configure) an ephemeral one.
func Unclaimed(host string) (int, error) {
	low := ephemeralLow()
	for range tries {
		if low-lowest < 1000 {
			break
		}
		p := lowest + rand.IntN(low-lowest)
		if p >= reserved[0] && p < reserved[1] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			continue // taken
		}
		l.Close()
		return p, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range; Linux's
// default when the file cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
