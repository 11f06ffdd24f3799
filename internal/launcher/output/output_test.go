package output

import (
	"strings"
	"testing"
)

func TestParsePerRankStreams(t *testing.T) {
	for _, c := range []struct {
		in, back string
		ok       bool
	}{
		{"3", "3", true}, {"0", "0", true}, {"0:3,1:2", "0:3,1:2", true}, {" 1 : 1 ", "1:1", true},
		{"4", "", false}, {"-1", "", false}, {"a", "", false}, {"0:5", "", false}, {"x:1", "", false}, {"", "", false},
	} {
		p, err := ParsePerRankStreams("redirects", c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.in, err, c.ok)
			continue
		}
		if c.ok && p.String() != c.back {
			t.Errorf("%q reads back as %q, want %q", c.in, p.String(), c.back)
		}
		if !c.ok && !strings.Contains(err.Error(), "--redirects") {
			t.Errorf("%q: error %q does not name the flag", c.in, err)
		}
	}
}
