package jobtls

import (
	"crypto/x509"
	"errors"
	"strings"
	"testing"
)

func TestVerifyPinned(t *testing.T) {
	ca, err := NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewCA("other")
	srv, err := ca.ServerCertificate([]string{"10.0.0.1", "0.0.0.0", "node1"})
	if err != nil {
		t.Fatal(err)
	}
	_, csr, _ := NewNodeKey()
	nodeDER, err := ca.IssueNode("node-2", csr)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, _ := x509.ParseCertificate(nodeDER)
	if NodeID(nodeCert) != "node-2" {
		t.Errorf("NodeID = %q", NodeID(nodeCert))
	}
	leaf, _ := LeafHash(srv)
	for _, c := range []struct {
		name  string
		chain [][]byte
		pin   string
		ok    bool
	}{
		{"the server's chain, CA pinned", srv.Certificate, ca.Hash(), true},
		{"the server's own pin", srv.Certificate, leaf, true},
		{"another CA pinned", srv.Certificate, other.Hash(), false},
		// A node (a token holder with a certificate) posing as the
		// coordinator: its certificate is for clients only.
		{"a node certificate", [][]byte{nodeDER, ca.Cert.Raw}, ca.Hash(), false},
		{"no certificate", nil, ca.Hash(), false},
	} {
		err := verifyPinned(c.chain, c.pin)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if c.name == "another CA pinned" && !errors.Is(err, ErrCAHashMismatch) {
			t.Errorf("%s: %v, want ErrCAHashMismatch", c.name, err)
		}
	}
	if _, err := (Trust{}).Config(nil); !errors.Is(err, ErrNoTrust) {
		t.Errorf("no trust: %v", err)
	}
	if err := CheckHash(ca.Hash()); err != nil {
		t.Error(err)
	}
	if CheckHash("sha256:abc") == nil || CheckHash("md5:"+ca.Hash()[7:]) == nil {
		t.Error("CheckHash accepts malformed hashes")
	}
	if _, err := ca.IssueNode("node-3", []byte("junk")); err == nil {
		t.Error("IssueNode accepts a junk request")
	}
}

// A malformed pin says what is wrong with it; a mismatch names both the
// pinned hash and the ones presented.
func TestCheckHashSaysWhy(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	for h, want := range map[string]string{
		"sha256:5f0c":                 "it has 4 hex digits, not 64",
		"sha256:5f0c…":                "cut short",
		"sha256:5f0c...":              "cut short",
		hex64:                         `does not start with "sha256:"`,
		"sha256:" + hex64[:62] + "zz": "not hex digits",
		"sha256:" + hex64 + "ab":      "66 hex digits",
	} {
		if err := CheckHash(h); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckHash(%q) = %v, want %q", h, err, want)
		}
	}
	if err := CheckHash("sha256:" + hex64); err != nil {
		t.Error(err)
	}
	ca, _ := NewCA("run")
	other, _ := NewCA("other")
	srv, _ := ca.ServerCertificate(nil)
	err := verifyPinned(srv.Certificate, other.Hash())
	if err == nil || !strings.Contains(err.Error(), "--ca-hash is "+other.Hash()) || !strings.Contains(err.Error(), "presented "+ca.Hash()) {
		t.Errorf("mismatch: %v; want both hashes named", err)
	}
}
