package nodehealth

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLedgerRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "gotrain", FileName)
	l := Open(path)
	if recs, skipped, err := l.Read(); err != nil || len(recs) != 0 || skipped != 0 {
		t.Fatalf("a missing ledger: %v %d %v", recs, skipped, err)
	}
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	want := Record{Time: t0, Host: "n1", Kind: Preflight, Check: "cpu-allreduce-bandwidth", Detail: "12 MB/s\nsecond line", RunID: "r1"}
	if err := l.Append(want); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ledger mode %v (%v), want 0600", st.Mode(), err)
	}
	recs, _, err := l.Read()
	if err != nil || len(recs) != 1 {
		t.Fatalf("%v %v", recs, err)
	}
	if got := recs[0]; got.Detail != "12 MB/s second line" || got.Host != "n1" || !got.Time.Equal(t0) {
		t.Errorf("read %+v", got)
	}
	var out bytes.Buffer
	WriteHistory(&out, path, "n1", recs, 0, t0, DefaultPolicy)
	if !strings.Contains(out.String(), "cpu-allreduce-bandwidth") || !strings.Contains(out.String(), "admitted") {
		t.Errorf("history:\n%s", out.String())
	}
}

func TestLedgerBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	l := Open(path)
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for i := range MaxRecords + 10 {
		if err := l.Append(Record{Time: t0.Add(time.Duration(i) * time.Second), Host: "n1", Kind: Lost, Detail: strings.Repeat("x", 2*maxText)}); err != nil {
			t.Fatal(err)
		}
	}
	recs, _, err := l.Read()
	if err != nil || len(recs) != MaxRecords {
		t.Fatalf("%d records (%v), want %d", len(recs), err, MaxRecords)
	}
	if !recs[0].Time.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("oldest kept %v, want the 11th", recs[0].Time)
	}
	if len(recs[0].Detail) > maxText {
		t.Errorf("detail of %d bytes kept", len(recs[0].Detail))
	}
}

// TestLedgerUntrusted: what is not a record is skipped and counted; a file
// others may write is refused.
func TestLedgerUntrusted(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	body := `{"time":"2026-12-07T12:00:00Z","host":"n1","kind":"preflight","check":"x"}
not json
{"time":"2026-12-07T12:00:00Z","host":"n1","kind":"reboot-the-cluster"}
{"time":"2026-12-07T12:00:00Z","host":"","kind":"lost"}
{"host":"n1","kind":"lost"}
{"time":"2026-12-07T12:00:00Z","host":"n1","kind":"xid","detail":"` + strings.Repeat("y", maxText+1) + `"}
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, skipped, err := Open(path).Read()
	if err != nil || len(recs) != 1 || skipped != 5 {
		t.Fatalf("%d records, %d skipped (%v); want 1 and 5", len(recs), skipped, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path).Read(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-writable ledger: %v, want refused", err)
	}
	link := filepath.Join(t.TempDir(), FileName)
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(link).Read(); err == nil {
		t.Error("a symbolic link was followed")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"time":"2026-12-07T12:00:00Z","host":"n1","kind":"preflight"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, _, _ := parse(bytes.NewReader(b))
		for _, r := range recs {
			if !ok(r) {
				t.Errorf("kept %+v", r)
			}
		}
	})
}
