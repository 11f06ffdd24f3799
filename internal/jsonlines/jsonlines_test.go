package jsonlines

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for line, want := range map[string]string{
		"gotrain: warning: node lost":           `{"level":"WARN","msg":"node lost","source":"gotrain"}`,
		"gotrain: error: no such file":          `{"level":"ERROR","msg":"no such file","source":"gotrain"}`,
		"gotrain: job failed: rank 1 exited 3":  `{"level":"ERROR","msg":"job failed: rank 1 exited 3","source":"gotrain"}`,
		"gotrain: rank 0 exited: restarting":    `{"level":"INFO","msg":"rank 0 exited: restarting","source":"gotrain"}`,
		"gotrain torchrun: note: --x no effect": `{"level":"INFO","msg":"note: --x no effect","source":"gotrain"}`,
		"[rank 12] loss=0.3":                    `{"level":"INFO","msg":"loss=0.3","source":"worker","rank":12}`,
		"[rank x] y":                            `{"level":"INFO","msg":"[rank x] y"}`,
		"  last 1 line(s) of rank 1's stderr:":  `{"level":"INFO","msg":"  last 1 line(s) of rank 1's stderr:"}`,
	} {
		got := strings.TrimSpace(string(Encode(Parse(line))))
		got = strings.Replace(got, `"time":"",`, "", 1)
		if got != want {
			t.Errorf("Parse(%q) = %s, want %s", line, got, want)
		}
	}
}

// Lines split over writes are joined, JSON objects pass through, a last line
// without newline comes out at Flush, an endless line is cut, and every
// output line is one JSON object.
func TestWriter(t *testing.T) {
	var out bytes.Buffer
	at := time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC)
	w := NewWriter(&out, "node2", "stderr", func() time.Time { return at })
	for _, s := range []string{"gotrain: warn", "ing: x\n[rank 1] a\r\n", `{"time":"t","level":"INFO","msg":"rec"}` + "\n", "bad utf8 \xff\n", "tail"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(bytes.Repeat([]byte("é"), MaxLine)); err != nil { // 2 bytes each: cut twice
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d lines, want 7:\n%.600s", len(lines), out.String())
	}
	var msgs []string
	for _, l := range lines {
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Level == "" {
			t.Fatalf("line %.200q: %v", l, err)
		}
		if len(l) > MaxLine+200 {
			t.Errorf("a line of %d bytes: want at most about %d", len(l), MaxLine)
		}
		msgs = append(msgs, r.Msg)
	}
	if want := []string{"x", "a", "rec", "bad utf8 \uFFFD", "tail"}; strings.Join(msgs[:5], "|") != strings.Join(want, "|") {
		t.Errorf("msgs %.300q, want %q first", msgs[:5], want)
	}
	if !strings.HasPrefix(lines[0], `{"time":"2026-12-07T21:00:00Z","level":"WARN","msg":"x","host":"node2","stream":"stderr","source":"gotrain"}`) {
		t.Errorf("first line %s", lines[0])
	}
	if lines[2] != `{"time":"t","level":"INFO","msg":"rec"}` {
		t.Errorf("a JSON record changed: %s", lines[2])
	}
}
