package slurm

import "testing"

// A grant decodes only from what encode writes, and back to it: no input
// read off the wire is taken for a grant other than the one it spells.
func FuzzGrantDecode(f *testing.F) {
	for _, s := range []string{"tok", "tok sha256:ab", "", " ", "tok ", " sha256:ab", "tok a b", "t\nk", "tok sha256:ab\r"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, ok := decodeGrant(s)
		if !ok {
			return
		}
		if g.encode() != s {
			t.Fatalf("decodeGrant(%q) = %+v, which encodes as %q", s, g, g.encode())
		}
		if g2, ok := decodeGrant(g.encode()); !ok || g2 != g {
			t.Fatalf("%+v does not survive encode and decode: %+v %v", g, g2, ok)
		}
	})
}
