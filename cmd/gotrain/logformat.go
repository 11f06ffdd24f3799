package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// Log formats (--log-format). People read the first: the same
// "gotrain: …" lines as every other message gotrain prints; logfmt is
// --verbose's timestamped trace (the tests and bench scripts parse it);
// JSON is for log collectors.
const (
	logPeople = "people"
	logLogfmt = "logfmt"
	logJSON   = "json"
)

// logFormatFlag is --log-format: "" until given, so that the default can
// follow --verbose.
type logFormatFlag struct{ v *string }

func (f logFormatFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f logFormatFlag) Set(s string) error {
	switch s {
	case logPeople, logLogfmt, logJSON:
		*f.v = s
		return nil
	}
	return fmt.Errorf("want %s, %s or %s", logPeople, logLogfmt, logJSON)
}

// newLogger is the agent's or coordinator's logger on w: format as
// --log-format gave it, else def.
func newLogger(w io.Writer, format, def string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "":
		return newLogger(w, def, def, level)
	case logJSON:
		return slog.New(slog.NewJSONHandler(w, opts))
	case logLogfmt:
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(&peopleHandler{w: w, level: level, mu: &sync.Mutex{}})
}

// peopleHandler writes a record as one line in the style of gotrain's
// other messages: "gotrain: warning: node lost: host=node2 reason=…" (no
// time: a terminal has its own). slog has no such handler; its TextHandler
// writes time=… level=… msg=… first.
type peopleHandler struct {
	w     io.Writer
	level slog.Level
	attrs string // from WithAttrs, already formatted
	group string // from WithGroup: "g." before each key
	mu    *sync.Mutex
}

func (h *peopleHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *peopleHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("gotrain: ")
	switch {
	case r.Level >= slog.LevelError:
		b.WriteString("error: ")
	case r.Level >= slog.LevelWarn:
		b.WriteString("warning: ")
	case r.Level < slog.LevelInfo:
		b.WriteString("debug: ")
	}
	b.WriteString(r.Message)
	attrs := h.attrs
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendAttr(attrs, h.group, a)
		return true
	})
	if attrs != "" {
		b.WriteString(":")
		b.WriteString(attrs)
	}
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *peopleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	for _, a := range as {
		c.attrs = appendAttr(c.attrs, c.group, a)
	}
	return &c
}

func (h *peopleHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group += name + "."
	return &c
}

// appendAttr adds " key=value" (groups flattened, values quoted where
// they hold spaces, quotes or '=') to s.
func appendAttr(s, prefix string, a slog.Attr) string {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			s = appendAttr(s, prefix+a.Key+".", g)
		}
		return s
	}
	if a.Key == "" {
		return s
	}
	text := v.String()
	if text == "" || strings.ContainsFunc(text, func(r rune) bool { return unicode.IsSpace(r) || r == '"' || r == '=' || !unicode.IsPrint(r) }) {
		text = strconv.Quote(text)
	}
	return s + " " + prefix + a.Key + "=" + text
}
