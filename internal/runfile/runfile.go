// Package runfile lets `gotrain diagnose` and `gotrain top` find the jobs
// running on this machine without flags: every `gotrain launch` writes a
// small JSON file with its coordinator's address, the job token and, when it
// serves them, its metrics address into a private directory
// ($XDG_RUNTIME_DIR/gotrain, else /tmp/gotrain-UID, mode 0700; the file is
// mode 0600) and removes it when it exits. The directory must be this
// user's own (PrivateDir: not a symbolic link, not another user's; one of
// ours open to others is closed again); when another user (or a link) took
// its path first, a private fallback beside it is made under a random name
// and used instead (MakeDir), where Dir and Live find it; run files of other users in it are
// ignored, and what launchers that were SIGKILLed left there (run files and
// token files of a pid that is gone) is removed at the next Write (Clean).
//
// # Usage
//
//	f, err := runfile.Write(runfile.Job{RunID: id, Coordinator: addr, Token: tok})
//	if err == nil { defer f.Remove() }
//
//	job, others, err := runfile.Newest() // in gotrain diagnose
package runfile

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/jobtls"
)

// ErrNoJob means no live job's run file was found.
var ErrNoJob = errors.New("runfile: no running gotrain job found on this machine")

// Job is what a run file holds.
type Job struct {
	RunID       string    `json:"run_id"`
	Coordinator string    `json:"coordinator"`
	Token       string    `json:"token"`
	Pid         int       `json:"pid"`
	Started     time.Time `json:"started"`
	// Metrics is where the coordinator serves Prometheus /metrics
	// (HOST:PORT); empty when it does not.
	Metrics string `json:"metrics,omitempty"`
	// Trust is how the launcher verified its coordinator (a pin, a CA
	// file, or no check), so that local tools verify it the same way.
	Trust jobtls.Trust `json:"tls"`
	// Path is where the file is; not stored.
	Path string `json:"-"`
}

// Dir returns the directory run files live in: $XDG_RUNTIME_DIR/gotrain,
// else /tmp/gotrain-UID, unless that path is not ours (MakeDir): then the
// fallback MakeDir made beside it, if any.
func Dir() string {
	primary := primaryDir()
	if !usable(primary) {
		if own := ownFallbacks(primary); len(own) > 0 {
			return own[0]
		}
	}
	return primary
}

// primaryDir is where run files go when the path is ours.
func primaryDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "gotrain")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("gotrain-%d", os.Getuid()))
}

// dirs lists where run files may be: the primary directory and the
// fallbacks of ours beside it (a launcher that started while the primary
// path was taken by another user wrote into one).
func dirs() []string {
	primary := primaryDir()
	return append([]string{primary}, ownFallbacks(primary)...)
}

// File is a written run file.
type File struct{ path string }

// Write writes j (Pid and Started default to this process and now) into
// Dir() as RUN_ID-PID.json.
func Write(j Job) (*File, error) {
	dir, err := MakeDir() // privdir.go
	if err != nil {
		return nil, fmt.Errorf("run-file dir: %w", err)
	}
	Clean(dir) // what launchers that were SIGKILLed left, with their tokens
	j.Pid = cmp.Or(j.Pid, os.Getpid())
	if j.Started.IsZero() {
		j.Started = time.Now()
	}
	b, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator {
			return '_'
		}
		return r
	}, j.RunID)
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.json", name, j.Pid))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("write run file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("write run file: %w", err)
	}
	return &File{path: path}, nil
}

// Remove deletes the run file.
func (f *File) Remove() error { return os.Remove(f.path) }

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Live returns the jobs whose launcher still runs, newest first. Files of
// launchers that are gone are removed.
func Live() ([]Job, error) {
	var paths []string
	for _, dir := range dirs() {
		p, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			return nil, err
		}
		paths = append(paths, p...)
	}
	var jobs []Job
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var j Job
		if json.Unmarshal(b, &j) != nil || j.Coordinator == "" || !ownedByMe(p) {
			continue // not a run file, or planted by someone else
		}
		j.Path = p
		if !alive(j.Pid) {
			os.Remove(p)
			continue
		}
		jobs = append(jobs, j)
	}
	slices.SortFunc(jobs, func(a, b Job) int { return b.Started.Compare(a.Started) })
	return jobs, nil
}

// Newest returns the newest live job and how many others run.
func Newest() (Job, int, error) {
	jobs, err := Live()
	if err != nil {
		return Job{}, 0, err
	}
	if len(jobs) == 0 {
		return Job{}, 0, fmt.Errorf("%w (looked in %s)", ErrNoJob, Dir())
	}
	return jobs[0], len(jobs) - 1, nil
}

// ErrNoSuchRun means no live job on this machine has the run id asked for.
var ErrNoSuchRun = errors.New("runfile: no running gotrain job with that run id on this machine")

// Find returns the live job with run id runID, or the newest when runID is
// "", and the other live jobs, newest first.
func Find(runID string) (Job, []Job, error) {
	jobs, err := Live()
	if err != nil {
		return Job{}, nil, err
	}
	return Pick(jobs, runID)
}

// Pick chooses among jobs (newest first, as Live returns them) the one with
// run id runID, or the newest when runID is "", and returns the others.
func Pick(jobs []Job, runID string) (Job, []Job, error) {
	if len(jobs) == 0 {
		return Job{}, nil, fmt.Errorf("%w (looked in %s)", ErrNoJob, Dir())
	}
	at := 0
	if runID != "" {
		at = slices.IndexFunc(jobs, func(j Job) bool { return j.RunID == runID })
		if at < 0 {
			return Job{}, jobs, fmt.Errorf("%w: %s (running: %s)", ErrNoSuchRun, runID, RunIDs(jobs))
		}
	}
	others := slices.Concat(jobs[:at], jobs[at+1:])
	return jobs[at], others, nil
}

// RunIDs lists the jobs' run ids, comma-separated.
func RunIDs(jobs []Job) string {
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.RunID
	}
	return strings.Join(ids, ", ")
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
