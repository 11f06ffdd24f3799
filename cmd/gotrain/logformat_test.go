package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// The people format is one "gotrain: …" line per record, the level a word
// only where it matters, values quoted where they must be; logfmt and JSON
// are slog's own.
func TestLogFormats(t *testing.T) {
	log := func(format, def string, level slog.Level) string {
		var b bytes.Buffer
		l := newLogger(&b, format, def, level).With("host", "node2")
		l.Info("standby ready", "slot", 1)
		l.Warn("node lost", "node_id", "node-3", "reason", `its agent is gone (nothing listens at "10.0.0.3:7946")`, "err", errors.New("EOF"))
		l.WithGroup("rank").Error("exited", "code", 2, "empty", "")
		return b.String()
	}
	if got, want := log("", logPeople, slog.LevelWarn), `gotrain: warning: node lost: host=node2 node_id=node-3 reason="its agent is gone (nothing listens at \"10.0.0.3:7946\")" err=EOF
gotrain: error: exited: host=node2 rank.code=2 rank.empty=""
`; got != want {
		t.Errorf("people, warnings:\n%s\nwant\n%s", got, want)
	}
	if got := log(logPeople, logLogfmt, slog.LevelInfo); !strings.HasPrefix(got, "gotrain: standby ready: host=node2 slot=1\n") {
		t.Errorf("people, info: %q", got)
	}
	if got := log("", logLogfmt, slog.LevelInfo); !strings.Contains(got, ` level=WARN msg="node lost" host=node2 node_id=node-3 `) || !strings.HasPrefix(got, "time=") {
		t.Errorf("logfmt (the --verbose default):\n%s", got)
	}
	for line := range strings.Lines(log(logJSON, logPeople, slog.LevelInfo)) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["host"] != "node2" || rec["msg"] == nil {
			t.Errorf("json line %q: %v %v", line, rec, err)
		}
	}
}

func TestLogFormatFlagRefusesOthers(t *testing.T) {
	var v string
	if err := (logFormatFlag{&v}).Set("text"); err == nil || !strings.Contains(err.Error(), "people, logfmt or json") {
		t.Errorf("Set(text) = %v", err)
	}
}
