package main

import "testing"

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1048576", 1 << 20, true}, {"64GiB", 64 << 30, true}, {"512 MiB", 512 << 20, true},
		{"2.5GB", 2.5e9, true}, {"8g", 8 << 30, true}, {"-1GiB", 0, false}, {"lots", 0, false}, {"", 0, false},
	} {
		got, err := parseBytes(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}
