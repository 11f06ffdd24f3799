package slurm

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
	"time"
)

func TestParseSignals(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // fmt of the signals, or "error"
	}{
		{DefaultSignals, "[user defined signal 1 user defined signal 2 hangup quit]"},
		{"usr1, SIGUSR1,sigquit", "[user defined signal 1 quit]"},
		{"", "[]"},
		{"none", "[]"},
		{"SIGTERM", "error"},
		{"SIGINT", "error"},
		{"SIGUSR3", "error"},
		{"SIGUSR1;SIGUSR2", "error"},
	} {
		got, err := ParseSignals(tc.in)
		s := fmt.Sprint(got)
		if err != nil {
			s = "error"
		}
		if s != tc.want {
			t.Errorf("ParseSignals(%q) = %s (%v), want %s", tc.in, s, err, tc.want)
		}
	}
	if got := Unforwarded([]syscall.Signal{syscall.SIGUSR1, syscall.SIGQUIT}); fmt.Sprint(got) != "[user defined signal 2 hangup]" {
		t.Errorf("Unforwarded = %v", got)
	}
}

func TestKillWait(t *testing.T) {
	files := map[string]string{
		"/etc/slurm/slurm.conf": "ClusterName=c\nKillWait=45 # seconds\n",
		"/x/slurm.conf":         "ClusterName=c\n#KillWait=5\nkillwait = 7\n",
		"/y/slurm.conf":         "ClusterName=c\n",
		"/z/slurm.conf":         "KillWait=soon\n",
	}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}
	for conf, want := range map[string]time.Duration{"": 45 * time.Second, "/x/slurm.conf": 7 * time.Second,
		"/y/slurm.conf": 30 * time.Second, "/z/slurm.conf": 0, "/missing": 0} {
		if got := KillWait(env("SLURM_CONF", conf), read); got != want {
			t.Errorf("SLURM_CONF=%q: KillWait %s, want %s", conf, got, want)
		}
	}
	if got := KillWait(env(), func(string) ([]byte, error) { return nil, errors.New("no") }); got != 0 {
		t.Errorf("unreadable slurm.conf: KillWait %s, want 0", got)
	}
}

func TestFitGrace(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		grace, killWait, want time.Duration
		note                  bool
	}{
		{10 * s, 0, 10 * s, false},      // KillWait unknown
		{10 * s, 30 * s, 10 * s, false}, // Slurm's default
		{10 * s, 12 * s, 10 * s, false}, // just fits with the margin
		{10 * s, 11 * s, 9 * s, true},
		{10 * s, 5 * s, 3 * s, true},
		{10 * s, 2 * s, s, true}, // at least a second
		{s / 2, 2 * s, s / 2, false},
	} {
		got, note := FitGrace(tc.grace, tc.killWait)
		if got != tc.want || (note != "") != tc.note {
			t.Errorf("FitGrace(%s, %s) = %s, %q; want %s, note %v", tc.grace, tc.killWait, got, note, tc.want, tc.note)
		}
	}
}
