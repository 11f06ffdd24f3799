package main

import (
	"flag"

	"github.com/gotrain/gotrain/internal/jobtls"
)

// Every control-plane connection is TLS: in plaintext, anyone on the path
// read the job token out of the calls' headers. A client verifies the
// coordinator besides its proof of the job token: by the hash of the job CA
// that the first node (or `gotrain coordinator`) printed, by the site's CA
// file, or by the proof alone.

// trustFlags registers how a client verifies the coordinator.
func trustFlags(fs *flag.FlagSet, t *jobtls.Trust) {
	fs.StringVar(&t.CAHash, "ca-hash", "", "sha256:HEX of the job CA, as the first node (or gotrain coordinator) printed it: the coordinator must present it (besides proving the job token); without it, the CA of the coordinator that proves the token is pinned at Join")
	fs.StringVar(&t.CAFile, "tls-ca", "", "CA certificate (PEM) of your site's PKI that issued the coordinator's --tls-cert; replaces --ca-hash")
	fs.BoolVar(&t.SkipCheck, "insecure-skip-ca-check", false, "kept for compatibility: check no certificate; the coordinator's proof of the job token alone verifies it (the token itself is never sent)")
}

// serverTLSFlags registers the certificate a coordinator presents instead
// of one from the job CA.
func serverTLSFlags(fs *flag.FlagSet, cert, key *string) {
	fs.StringVar(cert, "tls-cert", "", "the coordinator's certificate (PEM) from your site's PKI, with --tls-key; agents then join with --tls-ca instead of --ca-hash (default: a certificate from the job's own CA, made in memory)")
	fs.StringVar(key, "tls-key", "", "the key (PEM) of --tls-cert")
}
