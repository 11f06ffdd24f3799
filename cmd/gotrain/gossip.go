package main

import (
	"fmt"
	"net"

	"github.com/gotrain/gotrain/coordinator"
	"github.com/gotrain/gotrain/launcher"
)

// startGossip runs a standalone coordinator's memberlist node on its listen
// host (see coordinator.StartGossip). Listening on all interfaces, it
// advertises the host's outbound address.
func startGossip(srv *coordinator.Server, lis *net.TCPAddr, port int) (stop func(), err error) {
	var advertise string
	if lis.IP.IsUnspecified() {
		if advertise, err = launcher.OutboundAddress(); err != nil {
			return nil, fmt.Errorf("gossip: %w (pass --no-gossip, or --listen on this host's address)", err)
		}
	}
	_, stop, err = srv.StartGossip(coordinator.GossipBind(lis, port, advertise))
	if err != nil {
		return nil, fmt.Errorf("%w (choose another port with --gossip-port, or pass --no-gossip)", err)
	}
	return stop, nil
}
