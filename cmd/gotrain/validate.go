package main

import (
	"fmt"
	"net"
	"strings"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
)

// Input that can never work is refused at once, as a usage error (exit 2),
// before anything waits on it: a wait for a coordinator that a malformed
// --ca-hash can never verify would otherwise run to --join-timeout.

// checkTrust checks how a client is told to verify the coordinator: a
// well-formed --ca-hash, a --tls-ca file that holds certificates, not both.
func checkTrust(t jobtls.Trust) error {
	if t.CAHash != "" && t.CAFile != "" {
		return &usageError{msg: "--ca-hash and --tls-ca both given", hint: "Give one: --ca-hash for a coordinator of the job's own CA (the hash it printed), --tls-ca for one with a certificate of your site's PKI."}
	}
	if t.CAHash != "" {
		if err := jobtls.CheckHash(t.CAHash); err != nil {
			return &usageError{msg: err.Error(), hint: "Copy the whole --ca-hash sha256:... from the line the first node (or gotrain coordinator) printed; README's sha256:5f0c… is shortened."}
		}
	}
	if t.CAFile != "" {
		if _, err := jobtls.LoadCAFile(t.CAFile); err != nil {
			return &usageError{msg: err.Error(), hint: "Give the PEM file of the CA that issued the coordinator's --tls-cert."}
		}
	}
	return nil
}

// checkServerTLS checks --tls-cert and --tls-key: both or neither, and
// files that load as a pair (jobtls.LoadServerCertificate).
func checkServerTLS(cert, key string) error {
	if cert == "" && key == "" {
		return nil
	}
	if cert == "" || key == "" {
		return &usageError{msg: "--tls-cert without --tls-key (or the other way round)", hint: "Give both: the coordinator's certificate and its key, PEM files."}
	}
	if _, err := jobtls.LoadServerCertificate(cert, key); err != nil {
		return &usageError{msg: err.Error(), hint: "Give the coordinator's certificate (PEM) and its own private key (PEM, mode 0600)."}
	}
	return nil
}

// checkCoordinatorAddrs checks --coordinator: HOST:PORT, or several
// (a replicated coordinator's replicas) separated by commas, none empty.
func checkCoordinatorAddrs(addrs string) error {
	if addrs == "" {
		return nil
	}
	for _, a := range strings.Split(addrs, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return &usageError{msg: fmt.Sprintf("--coordinator %q has an empty entry", addrs), hint: "Give HOST:PORT, or the replicas' HOST:PORT separated by single commas, e.g. --coordinator a1:29400,a2:29400,a3:29400."}
		}
		if err := checkHostPort("--coordinator", a, true); err != nil {
			return err
		}
		if h, _, _ := net.SplitHostPort(a); h == "" {
			return &usageError{msg: fmt.Sprintf("--coordinator %q has no host", a), hint: "Give the coordinator's HOST:PORT, e.g. --coordinator 10.0.0.1:29400."}
		}
	}
	return nil
}

// checkNodeAddr checks --node-addr: a host (name or IP address), no port.
func checkNodeAddr(addr string) error {
	if addr == "" || net.ParseIP(addr) != nil {
		return nil
	}
	if strings.ContainsAny(addr, ":/ ,") {
		return &usageError{msg: fmt.Sprintf("--node-addr %q", addr), hint: "Give this node's address alone, with no port, e.g. --node-addr 10.0.0.2."}
	}
	return nil
}

// checkJoin checks what a node that joins a coordinator needs before it
// can send anything: the job token, and a way to verify the coordinator.
func checkJoin(tok string, t jobtls.Trust) error {
	if tok == "" {
		return &usageError{msg: "joining a coordinator needs its job token, and none was given",
			hint: "Set " + jobenv.JobToken + "=$(cat FILE) with the file the first node (or gotrain coordinator) named, or pass --" + FlagJobTokenFile + " FILE."}
	}
	// Without --ca-hash or --tls-ca the coordinator is verified by its
	// proof of the token alone (jobtls.Trust): whoever holds the token
	// could pose as it to this node.
	_ = t
	return nil
}
