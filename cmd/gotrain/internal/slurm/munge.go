package slurm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Munge is the part of MUNGE (Slurm's own authentication service) that the
// token exchange needs; MungeCLI runs munge(1) and unmunge(1).
type Munge interface {
	// Encode makes a credential of this process's uid carrying payload that
	// only restrictUID (and root) can decode.
	Encode(ctx context.Context, payload string, restrictUID int) (string, error)
	// Decode checks cred (signature, time to live, not replayed) and returns
	// the uid that made it and its payload.
	Decode(ctx context.Context, cred string) (uid int, payload string, err error)
}

// MungeCLI runs munge and unmunge against munged's socket (empty: munge's
// default, /run/munge/munge.socket.2).
type MungeCLI struct{ Socket string }

var _ Munge = MungeCLI{}

func (m MungeCLI) args(a ...string) []string {
	if m.Socket != "" {
		a = append(a, "--socket="+m.Socket)
	}
	return a
}

// Encode runs `munge --restrict-uid=UID` with payload on stdin.
func (m MungeCLI) Encode(ctx context.Context, payload string, restrictUID int) (string, error) {
	cmd := exec.CommandContext(ctx, "munge", m.args("--restrict-uid="+strconv.Itoa(restrictUID))...)
	cmd.Stdin = strings.NewReader(payload)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("munge: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// Decode runs `unmunge --numeric --keys=UID` with cred on stdin.
func (m MungeCLI) Decode(ctx context.Context, cred string) (int, string, error) {
	cmd := exec.CommandContext(ctx, "unmunge", m.args("--numeric", "--keys=UID")...)
	cmd.Stdin = strings.NewReader(cred + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, "", fmt.Errorf("unmunge: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	meta, payload, ok := strings.Cut(string(out), "\n\n")
	if !ok {
		return 0, "", fmt.Errorf("unmunge: no payload in %q", out)
	}
	for _, line := range strings.Split(meta, "\n") {
		k, v, _ := strings.Cut(line, ":")
		if strings.TrimSpace(k) == "UID" {
			uid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, "", fmt.Errorf("unmunge: UID %q: %w", v, err)
			}
			return uid, payload, nil
		}
	}
	return 0, "", errors.New("unmunge: no UID in its output")
}

// MungeSocket is the munged socket that Slurm uses: $GOTRAIN_MUNGE_SOCKET,
// else the socket= of AuthInfo in slurm.conf ($SLURM_CONF, default
// /etc/slurm/slurm.conf), else "" (munge's default).
func MungeSocket(getenv func(string) string, readFile func(string) ([]byte, error)) string {
	if s := getenv("GOTRAIN_MUNGE_SOCKET"); s != "" {
		return s
	}
	conf := getenv("SLURM_CONF")
	if conf == "" {
		conf = "/etc/slurm/slurm.conf"
	}
	b, err := readFile(conf)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "AuthInfo") {
			continue
		}
		for _, opt := range strings.Split(strings.TrimSpace(v), ",") {
			if ok, val, _ := cutFold(opt, "socket="); ok {
				return val
			}
		}
	}
	return ""
}

func cutFold(s, prefix string) (bool, string, error) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return true, s[len(prefix):], nil
	}
	return false, "", nil
}
