package agentcore_test

import (
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher/agentcore"
)

func TestKeepStandbys(t *testing.T) {
	const mib, gib = uint64(1) << 20, uint64(1) << 30
	for _, tc := range []struct {
		name         string
		mode         agentcore.StandbyMode
		avail, total uint64
		rss          []uint64
		keep         bool
		line         string // a part of it; "" for none
	}{
		{"plenty", agentcore.StandbyAuto, 64 * gib, 128 * gib, []uint64{230 * mib, 230 * mib}, true, ""},
		// 10% of 128 GiB is kept free: 12.8 GiB + 460 MiB.
		{"the 10% reserve", agentcore.StandbyAuto, 13 * gib, 128 * gib, []uint64{230 * mib, 230 * mib}, false,
			"need 13.2 GiB available (460 MiB, one standby per rank holding about its RSS, plus 12.8 GiB to spare) but 13.0 GiB is (MemAvailable, of 128.0 GiB); --standby=on keeps them anyway"},
		{"just fits", agentcore.StandbyAuto, 128*gib/10 + 460*mib, 128 * gib, []uint64{230 * mib, 230 * mib}, true, ""},
		// At least 1 GiB on a small node.
		{"the 1 GiB floor", agentcore.StandbyAuto, 1200 * mib, 4 * gib, []uint64{200 * mib}, false, "plus 1.00 GiB to spare"},
		{"the floor fits", agentcore.StandbyAuto, 1200 * mib, 4 * gib, []uint64{100 * mib, 50 * mib}, true, ""},
		{"one byte short", agentcore.StandbyAuto, 128*gib/10 + 460*mib - 1, 128 * gib, []uint64{230 * mib, 230 * mib}, false, "no hot standbys"},
		{"no ranks running", agentcore.StandbyAuto, 2 * gib, 8 * gib, nil, true, ""},
		{"on ignores memory", agentcore.StandbyOn, 10 * mib, 8 * gib, []uint64{4 * gib}, true, ""},
		{"off keeps none, silently", agentcore.StandbyOff, 64 * gib, 128 * gib, nil, false, ""},
		{"memory unknown", agentcore.StandbyAuto, 0, 0, []uint64{4 * gib}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keep, line := agentcore.KeepStandbys(tc.mode, tc.avail, tc.total, tc.rss)
			if keep != tc.keep {
				t.Errorf("keep = %v, want %v (line %q)", keep, tc.keep, line)
			}
			switch {
			case tc.line == "" && line != "":
				t.Errorf("line = %q, want none", line)
			case !strings.Contains(line, tc.line):
				t.Errorf("line = %q, want it to contain %q", line, tc.line)
			case strings.Contains(line, "\n"):
				t.Errorf("line = %q: more than one line", line)
			}
		})
	}
}
