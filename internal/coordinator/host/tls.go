package host

import (
	"context"
	"crypto/tls"
	"net"
	"os"

	"github.com/gotrain/gotrain/internal/jobtls"
)

// credentials makes the job CA (random, in memory only: it never touches
// disk; a standalone replica takes its peers', peerca.go) and
// the certificate the coordinator presents: the site's (TLSCert, TLSKey),
// or one from the job CA for jobtls.ServerName, localhost, the listen
// address, the advertised address and this host's name. pin is what local
// tools pin (Coordinator.Pin).
func (c Config) credentials(ctx context.Context) (ca *jobtls.CA, cert tls.Certificate, pin string, err error) {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return nil, cert, "", &ConfigError{Msg: "--tls-cert without --tls-key (or the other way round)", Hint: "Give both: the coordinator's certificate and its key, PEM files."}
	}
	switch {
	case c.CA != nil:
		ca = c.CA
	case c.JoinReplica:
		// A node's replica gets the CA from the set (launcher: ReplicaCA).
		return nil, cert, "", &ConfigError{Msg: "a replica hosted by a node needs the job CA", Hint: "The agent asks the coordinator for it (ReplicaCA) before it starts the replica."}
	case len(c.Peers) > 1:
		if ca, err = c.peerCA(ctx); err != nil { // peerca.go
			return nil, cert, "", err
		}
	default:
		if ca, err = jobtls.NewCA(c.RunID); err != nil {
			return nil, cert, "", err
		}
	}
	if c.TLSCert != "" {
		if cert, err = jobtls.LoadServerCertificate(c.TLSCert, c.TLSKey); err != nil {
			return nil, cert, "", err
		}
		pin, err = jobtls.LeafHash(cert)
		return ca, cert, pin, err
	}
	var hosts []string
	if h, _, err := net.SplitHostPort(c.Listen); err == nil {
		hosts = append(hosts, h)
		if ip := net.ParseIP(h); (h == "" || ip != nil && ip.IsUnspecified()) && c.AdvertiseAddr != nil {
			if a, err := c.AdvertiseAddr(); err == nil {
				hosts = append(hosts, a)
			}
		}
	}
	if name, err := os.Hostname(); err == nil {
		hosts = append(hosts, name)
	}
	cert, err = ca.ServerCertificate(hosts)
	return ca, cert, ca.Hash(), err
}

// CAHash is what a joining agent is given to verify this coordinator
// (--ca-hash): the job CA's hash; "" when the coordinator presents a
// certificate of the site's PKI (agents verify it with --tls-ca).
func (c *Coordinator) CAHash() string {
	if c.cfg.TLSCert != "" {
		return ""
	}
	return c.ca.Hash()
}

// Pin is what a client on this machine pins to verify this coordinator
// (the run file's, for gotrain diagnose and top): the job CA's hash, or
// the site certificate's own.
func (c *Coordinator) Pin() string { return c.pin }

// VerifyFlags are the flags a joining agent needs to verify a coordinator
// whose CAHash is caHash: --ca-hash, or, for a certificate of the site's
// PKI (no hash), --tls-ca with the site's CA file.
func VerifyFlags(caHash string) string {
	if caHash == "" {
		return "--tls-ca YOUR_SITE_CA.pem"
	}
	return "--ca-hash " + caHash
}
