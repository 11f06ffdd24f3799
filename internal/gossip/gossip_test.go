package gossip

import (
	"bytes"
	"crypto/sha256"
	"testing"
	"time"
)

func TestKey(t *testing.T) {
	k := Key("tok")
	if len(k) != 32 {
		t.Fatalf("len(Key) = %d, want 32 (AES-256)", len(k))
	}
	if !bytes.Equal(k, Key("tok")) {
		t.Error("Key is not deterministic: every node of the job must derive the same key")
	}
	if bytes.Equal(k, Key("tok2")) {
		t.Error("two tokens give the same key")
	}
	if raw := sha256.Sum256([]byte("tok")); bytes.Equal(k, raw[:]) {
		t.Error("Key is the bare hash of the token; it must include the label")
	}
	want := sha256.Sum256([]byte("gotrain/gossip/v1 key\x00tok"))
	if !bytes.Equal(k, want[:]) {
		t.Errorf("Key(tok) = %x, want %x", k, want)
	}
}

func TestConfig(t *testing.T) {
	if _, err := Config(Options{Token: "t"}); err == nil {
		t.Error("Config without a name: no error")
	}
	if _, err := Config(Options{Name: "n"}); err == nil {
		t.Error("Config without a token: no error")
	}
	c, err := Config(Options{Name: "node-2", BindAddr: "127.0.0.1", Port: 0, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "node-2" || c.BindAddr != "127.0.0.1" || c.BindPort != 0 ||
		c.ProbeInterval != 500*time.Millisecond || c.ProbeTimeout != 250*time.Millisecond || c.SuspicionMult != 2 ||
		!bytes.Equal(c.SecretKey, Key("t")) || c.Logger == nil || c.LogOutput != nil {
		t.Errorf("Config = %+v", c)
	}
}
