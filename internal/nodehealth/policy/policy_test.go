package policy

import (
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	rec := func(host string, ago time.Duration) Record {
		return Record{Time: t0.Add(-ago), Host: host, Kind: Preflight, Check: "cpu-allreduce-bandwidth"}
	}
	p := Policy{Failures: 2, Window: time.Hour, CoolOff: 30 * time.Minute}
	for _, tc := range []struct {
		name  string
		recs  []Record
		admit bool
		until time.Time
	}{
		{"no record", nil, true, time.Time{}},
		{"one failure", []Record{rec("a", time.Minute)}, true, time.Time{}},
		{"two within the window, cooling off", []Record{rec("a", 50*time.Minute), rec("a", 10*time.Minute)}, false, t0.Add(20 * time.Minute)},
		{"two within the window, cooled off", []Record{rec("a", 90*time.Minute), rec("a", 40*time.Minute)}, true, time.Time{}},
		{"two, further apart than the window", []Record{rec("a", 70*time.Minute), rec("a", 5*time.Minute)}, true, time.Time{}},
		{"two at the window's edge", []Record{rec("a", 65*time.Minute), rec("a", 5*time.Minute)}, false, t0.Add(25 * time.Minute)},
		{"another host's failures", []Record{rec("b", 20*time.Minute), rec("b", 10*time.Minute), rec("a", time.Minute)}, true, time.Time{}},
		{"out of order in the file", []Record{rec("a", 10*time.Minute), rec("a", 30*time.Minute)}, false, t0.Add(20 * time.Minute)},
		{"a record from the future is ignored", []Record{rec("a", 10*time.Minute), rec("a", -time.Hour)}, true, time.Time{}},
		{"losing the coordinator does not count", []Record{{Time: t0.Add(-20 * time.Minute), Host: "a", Kind: Lost}, {Time: t0.Add(-10 * time.Minute), Host: "a", Kind: Lost}, rec("a", time.Minute)}, true, time.Time{}},
		{"a straggler and an XID count", []Record{{Time: t0.Add(-20 * time.Minute), Host: "a", Kind: Straggler}, {Time: t0.Add(-10 * time.Minute), Host: "a", Kind: XID}}, false, t0.Add(20 * time.Minute)},
		{"the latest pair counts", []Record{rec("a", 55*time.Minute), rec("a", 50*time.Minute), rec("a", 2*time.Minute)}, false, t0.Add(28 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.recs, "a", t0, p)
			if d.Admit != tc.admit || !d.Until.Equal(tc.until) {
				t.Fatalf("admit %v until %v, want %v until %v (%s)", d.Admit, d.Until, tc.admit, tc.until, d.Line)
			}
			if !d.Admit && (d.Line == "" || len(d.Because) != 2) {
				t.Errorf("refused with line %q and %d records, want a line and 2", d.Line, len(d.Because))
			}
		})
	}
	if d := Decide([]Record{rec("a", time.Minute), rec("a", 2*time.Minute)}, "a", t0, Policy{}); !d.Admit {
		t.Errorf("a zero policy keeps no one out: %+v", d)
	}
}
