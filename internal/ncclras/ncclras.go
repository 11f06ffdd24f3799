// Package ncclras queries NCCL's RAS service (NCCL 2.24 and later): every
// NCCL process of a job serves a small line protocol on localhost:28028
// (NCCL_RAS_ADDR) that reports the whole job as NCCL sees it — its
// communicators, which ranks are missing or dead, and errors. The agent
// asks it for evidence when the hang detector fires on an NCCL job, so that
// PyTorch jobs, which do not report through gotrain's worker library, get a
// verdict too.
//
// The protocol: the client says "CLIENT PROTOCOL n", the server answers
// "SERVER PROTOCOL m"; "TIMEOUT s" and "SET FORMAT json" are answered "OK";
// "STATUS" (or "VERBOSE STATUS") is answered with the report, up to EOF.
//
// # Usage
//
//	rep, err := ncclras.Query(ctx, ncclras.DefaultAddr, ncclras.Options{Format: "json"})
//	if err == nil { fmt.Println(rep.Problems) }
package ncclras

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultAddr is where NCCL serves RAS clients unless NCCL_RAS_ADDR says
// otherwise.
const DefaultAddr = "localhost:28028"

// clientProtocol is the protocol version this client speaks.
const clientProtocol = 2

// maxReport bounds how much of a report is read.
const maxReport = 4 << 20

// ErrProtocol means the other side does not speak NCCL's RAS protocol.
var ErrProtocol = errors.New("ncclras: unexpected answer")

// ErrNoJSON means the RAS service refused SET FORMAT json: NCCL before
// 2.28 speaks text only.
var ErrNoJSON = errors.New("ncclras: no JSON format (NCCL older than 2.28?)")

// Options of a query.
type Options struct {
	// Format is "text" (default) or "json" (NCCL 2.28 and later).
	Format string
	// Verbose asks for the verbose report.
	Verbose bool
	// Timeout is how long NCCL waits for the other processes' answers; 0
	// keeps NCCL's default.
	Timeout time.Duration
}

// Report is what RAS said.
type Report struct {
	// ServerProtocol is the protocol version NCCL speaks.
	ServerProtocol int
	// Raw is the report as NCCL wrote it.
	Raw string
	// Problems are the report's errors and warnings, one per line, in order.
	Problems []string
}

// Query asks the RAS service at addr for the job's status. The context's
// deadline bounds the whole exchange.
func Query(ctx context.Context, addr string, o Options) (*Report, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ncclras: connect to %s (is an NCCL 2.24+ job running here with RAS enabled?): %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	rep, err := exchange(conn, o)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("ncclras: %s: %w", addr, ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("ncclras: %s: %w", addr, err)
	}
	return rep, nil
}

// exchange runs the protocol over rw.
func exchange(rw io.ReadWriter, o Options) (*Report, error) {
	br := bufio.NewReader(rw)
	say := func(line string) (string, error) {
		if _, err := io.WriteString(rw, line+"\n"); err != nil {
			return "", err
		}
		resp, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(resp), nil
	}
	resp, err := say(fmt.Sprintf("CLIENT PROTOCOL %d", clientProtocol))
	if err != nil {
		return nil, err
	}
	v, ok := strings.CutPrefix(strings.ToUpper(resp), "SERVER PROTOCOL ")
	if !ok {
		return nil, fmt.Errorf("%w to the handshake: %q", ErrProtocol, resp)
	}
	rep := &Report{}
	rep.ServerProtocol, _ = strconv.Atoi(strings.TrimSpace(v))
	if o.Timeout > 0 {
		if resp, err := say(fmt.Sprintf("TIMEOUT %d", max(1, int(o.Timeout.Seconds())))); err != nil {
			return nil, err
		} else if !strings.EqualFold(resp, "OK") {
			return nil, fmt.Errorf("%w to TIMEOUT: %q", ErrProtocol, resp)
		}
	}
	format := strings.ToLower(o.Format)
	if format == "json" {
		if resp, err := say("SET FORMAT json"); err != nil {
			return nil, err
		} else if !strings.EqualFold(resp, "OK") {
			return nil, fmt.Errorf("%w: %w to SET FORMAT json: %q", ErrNoJSON, ErrProtocol, resp)
		}
	}
	cmd := "STATUS"
	if o.Verbose {
		cmd = "VERBOSE STATUS"
	}
	if _, err := io.WriteString(rw, cmd+"\n"); err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(br, maxReport))
	if err != nil {
		return nil, err
	}
	rep.Raw = string(raw)
	if format == "json" {
		rep.Problems, err = problemsJSON(raw)
		if err != nil {
			return rep, fmt.Errorf("%w: the JSON report does not parse: %w", ErrProtocol, err)
		}
	} else {
		rep.Problems = problemsText(rep.Raw)
	}
	return rep, nil
}

// problemsText returns the lines of the text report's error and warning
// sections. A section starts with a heading, a line underlined by '=' or
// '-', and runs to the next heading.
func problemsText(s string) []string {
	lines := strings.Split(s, "\n")
	underline := func(i int) bool {
		if i >= len(lines) {
			return false
		}
		t := strings.TrimSpace(lines[i])
		return t != "" && (strings.Trim(t, "=") == "" || strings.Trim(t, "-") == "")
	}
	var out []string
	in := false
	for i := 0; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if t != "" && !underline(i) && underline(i+1) {
			low := strings.ToLower(t)
			in = low == "errors" || low == "warnings"
			i++ // the underline
			continue
		}
		if in && t != "" {
			out = append(out, t)
		}
	}
	return out
}

// problemsJSON collects the entries of every "errors" and "warnings" array
// (or object) in a JSON report, as compact JSON or plain strings.
func problemsJSON(raw []byte) ([]string, error) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				if lk := strings.ToLower(k); lk == "errors" || lk == "warnings" {
					out = append(out, flatten(v[k])...)
					continue
				}
				walk(v[k])
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	return out, nil
}

func flatten(v any) []string {
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, flatten(e)...)
		}
		return out
	default:
		b, _ := json.Marshal(v)
		return []string{string(b)}
	}
}
