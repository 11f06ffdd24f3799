package observe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/launcher/recovery"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The root-cause report: what the agent can find out about a worker that
// ended badly, beyond its exit status: whether the kernel's OOM killer ended
// it (the memory cgroup's oom_kill counter, and the kernel log), GPU XID
// errors logged while it ran, and its last lines of stderr. Everything here
// degrades to "nothing found" when a file is missing or unreadable (no root,
// no cgroup v1/v2 memory controller, /dev/kmsg restricted).

// RootCauseFile is the name of the JSON report written into the log dir.
const RootCauseFile = "root-cause.json"

// Evidence is a snapshot taken when a worker starts, compared at its exit.
type Evidence struct {
	oomKills   int64 // the memory cgroup's oom_kill counter, -1 if unknown
	cgroupFile string
	monoStart  time.Duration // CLOCK_MONOTONIC at start: kernel log timestamps use it
}

// AgentMemoryEventsFile is memoryEventsFile of the agent's own cgroup, which
// its workers share; found once per agent (Run), not per worker.
func AgentMemoryEventsFile() string {
	return memoryEventsFile("/proc/self/cgroup", "/sys/fs/cgroup")
}

// SnapshotEvidence reads the counters a failure report compares against;
// cgroupFile is AgentMemoryEventsFile's, "" for none.
func SnapshotEvidence(cgroupFile string) Evidence {
	e := Evidence{oomKills: -1, monoStart: monotonicNow()}
	if cgroupFile != "" {
		if n, ok := readOOMKills(cgroupFile); ok {
			e.cgroupFile, e.oomKills = cgroupFile, n
		}
	}
	return e
}

func monotonicNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// memoryEventsFile finds the file holding the oom_kill counter of the memory
// cgroup named in procCgroup: memory.events (cgroup v2) or
// memory.oom_control (v1). "" when there is none.
func memoryEventsFile(procCgroup, root string) string {
	b, err := os.ReadFile(procCgroup)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var candidates []string
		switch {
		case parts[0] == "0" && parts[1] == "":
			candidates = []string{filepath.Join(root, parts[2], "memory.events"), filepath.Join(root, "unified", parts[2], "memory.events")}
		case strings.Contains(","+parts[1]+",", ",memory,"):
			candidates = []string{filepath.Join(root, "memory", parts[2], "memory.oom_control"), filepath.Join(root, "memory", "memory.oom_control")}
		}
		for _, c := range candidates {
			if _, ok := readOOMKills(c); ok {
				return c
			}
		}
	}
	return ""
}

// readOOMKills reads the "oom_kill N" line of a memory.events or
// memory.oom_control file.
func readOOMKills(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	return parseOOMKills(b)
}

func parseOOMKills(b []byte) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == "oom_kill" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// kernelRecord is one record of the kernel log.
type kernelRecord struct {
	at  time.Duration // since boot, CLOCK_MONOTONIC
	msg string
}

// readKernelLog returns the kernel log records /dev/kmsg still holds; nil
// when it cannot be read (no CAP_SYSLOG, dmesg_restrict, no such device).
func readKernelLog() []kernelRecord {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var recs []kernelRecord
	buf := make([]byte, 8192)
	for len(recs) < 100000 {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // overwritten while we read; the next read resumes
		}
		if err != nil || n <= 0 {
			break
		}
		if r, ok := parseKmsg(buf[:n]); ok {
			recs = append(recs, r)
		}
	}
	return recs
}

// parseKmsg parses one /dev/kmsg record: "prio,seq,usec,flags[,...];message\n"
// followed by continuation lines.
func parseKmsg(b []byte) (kernelRecord, bool) {
	head, msg, ok := bytes.Cut(b, []byte(";"))
	if !ok {
		return kernelRecord{}, false
	}
	fields := strings.Split(string(head), ",")
	if len(fields) < 3 {
		return kernelRecord{}, false
	}
	us, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil || us < 0 {
		return kernelRecord{}, false
	}
	line, _, _ := bytes.Cut(msg, []byte("\n"))
	return kernelRecord{at: time.Duration(us) * time.Microsecond, msg: string(line)}, true
}

var (
	// "Out of memory: Killed process 1234 (train) total-vm:..." and
	// "Memory cgroup out of memory: Killed process 1234 (train) ...".
	oomKilledRE = regexp.MustCompile(`[Oo]ut of memory: Kill(?:ed)? process (\d+)`)
	// "oom-kill:constraint=...,task=train,pid=1234,uid=0"
	oomKillRE = regexp.MustCompile(`oom-kill:.*[,:]pid=(\d+)`)
	xidRE     = regexp.MustCompile(`NVRM: Xid`)
)

// scanKernelLog finds, among recs logged at or after since, OOM kills of any
// of pids and GPU XID errors.
func scanKernelLog(recs []kernelRecord, since time.Duration, pids map[int]bool) (oom []string, xids []string) {
	for _, r := range recs {
		if r.at < since {
			continue
		}
		for _, re := range []*regexp.Regexp{oomKilledRE, oomKillRE} {
			if m := re.FindStringSubmatch(r.msg); m != nil {
				if pid, _ := strconv.Atoi(m[1]); pids[pid] {
					oom = append(oom, r.msg)
					break
				}
			}
		}
		if xidRE.MatchString(r.msg) && len(xids) < 20 {
			xids = append(xids, r.msg)
		}
	}
	return oom, xids
}

// ExamineExit adds what the node knows about a bad exit to req.
func ExamineExit(req *gotrainv1.ReportWorkerExitRequest, e Evidence, pgid int, sig unix.Signal) {
	killed := sig == unix.SIGKILL
	if e.cgroupFile != "" && e.oomKills >= 0 {
		if n, ok := readOOMKills(e.cgroupFile); ok && n > e.oomKills {
			req.Notes = append(req.Notes, fmt.Sprintf("%s: oom_kill rose from %d to %d while the worker ran", e.cgroupFile, e.oomKills, n))
			if killed {
				req.OomKilled = true
			}
		}
	}
	// The kernel log names the pid it killed: the worker, or a process of
	// its group (pgid is the worker's pid).
	pids := map[int]bool{int(req.GetPid()): true, pgid: true}
	oom, xids := scanKernelLog(readKernelLog(), e.monoStart, pids)
	if len(oom) > 0 {
		req.OomKilled = true
		req.Notes = append(req.Notes, oom...)
	}
	req.XidErrors = append(req.XidErrors, xids...)
}

// rootCauseReport is the JSON written to <log-dir>/root-cause.json.
type rootCauseReport struct {
	RunID      string     `json:"run_id"`
	Time       time.Time  `json:"time"`
	Succeeded  bool       `json:"succeeded"`
	ExitCode   int        `json:"exit_code"`
	Generation int64      `json:"generation"`
	Restarts   int        `json:"restart_count"`
	Message    string     `json:"message"`
	Failure    *failureJS `json:"failure,omitempty"`
	// Recoveries are this node's restarts, timed phase by phase.
	Recoveries []recovery.Timing `json:"recoveries"`
}

type failureJS struct {
	Rank      int    `json:"rank"`
	Hostname  string `json:"hostname"`
	NodeID    string `json:"node_id,omitempty"`
	Pid       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	Reason    string `json:"reason,omitempty"`
	OOMKilled bool   `json:"oom_killed"`
	// Cause names a cause found in the rank's output ("rank 0 on node3
	// ran out of GPU memory"), Fixes what usually helps; both empty when
	// none was found.
	Cause      string   `json:"cause,omitempty"`
	Fixes      string   `json:"fixes,omitempty"`
	XIDErrors  []string `json:"xid_errors"`
	Notes      []string `json:"notes"`
	StderrTail []string `json:"stderr_tail"`
}

func failureJSON(fl *gotrainv1.WorkerFailure) *failureJS {
	if fl == nil {
		return nil
	}
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	js := &failureJS{
		Rank: int(fl.GetRank()), Hostname: fl.GetHostname(), NodeID: fl.GetNodeId(), Pid: int(fl.GetPid()),
		ExitCode: int(fl.GetExitCode()), Signal: fl.GetSignal(), Reason: fl.GetReason(),
		OOMKilled: fl.GetOomKilled(), XIDErrors: nonNil(fl.GetXidErrors()), Notes: nonNil(fl.GetNotes()),
		StderrTail: nonNil(fl.GetStderrTail()),
	}
	if _, ok := FindCUDAOOM(fl.GetStderrTail()); ok && fl.GetSignal() == "" && !fl.GetOomKilled() && fl.GetPid() != 0 {
		js.Cause = fmt.Sprintf("rank %d on %s ran out of GPU memory", fl.GetRank(), fl.GetHostname())
		js.Fixes = OOMFixes
	}
	return js
}

// writeRootCause writes the report into dir atomically: a reader sees the old
// file or the new one, never a part.
func writeRootCause(dir string, r rootCauseReport) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, RootCauseFile), append(b, '\n'))
}

func writeFileAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(f.Name(), name); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if d, err := os.Open(filepath.Dir(name)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// WriteEvidence adds the OOM and XID findings to a failure report.
func WriteEvidence(w io.Writer, fl *gotrainv1.WorkerFailure) {
	if fl.GetOomKilled() {
		fmt.Fprintf(w, "\n  the kernel's OOM killer ended it: the worker ran out of memory (lower the batch size or the workers per node)")
	}
	for _, n := range fl.GetNotes() {
		fmt.Fprintf(w, "\n  evidence: %s", n)
	}
	if x := fl.GetXidErrors(); len(x) > 0 {
		fmt.Fprintf(w, "\n  GPU XID errors in the kernel log while it ran:")
		for _, l := range x {
			fmt.Fprintf(w, "\n    %s", l)
		}
	}
}

// RecordRootCause writes the job's end into the run's log dir: a
// failure's root cause, or that it succeeded, so that the file there always
// says how this run ended (a run never sees another's: each has its own
// directory). exitCode is the code the job ends with; gen the last
// generation, nil if none started.
func RecordRootCause(dir, runID string, f *gotrainv1.JobFinished, exitCode int, gen *gotrainv1.GenerationStarted, recoveries []recovery.Timing) error {
	r := rootCauseReport{
		RunID: runID, Time: time.Now().UTC(), Succeeded: f.GetSucceeded(), ExitCode: exitCode,
		Message: f.GetMessage(), Failure: failureJSON(f.GetFailure()), Recoveries: recoveries,
	}
	if r.Recoveries == nil {
		r.Recoveries = []recovery.Timing{}
	}
	if r.Succeeded {
		r.ExitCode = 0
	}
	if gen != nil {
		r.Generation, r.Restarts = gen.GetGeneration(), int(gen.GetRestartCount())
	}
	return writeRootCause(dir, r)
}

// RecoveryFile is the name of the file in the log dir that lists the
// node's restarts, timed phase by phase, as they complete.
const RecoveryFile = "recovery.json"

// RecordRecoveries writes the node's timed restarts so far into dir
// (atomically: a reader sees one whole list).
func RecordRecoveries(dir, runID string, rs []recovery.Timing) error {
	b, err := json.MarshalIndent(struct {
		RunID      string            `json:"run_id"`
		Recoveries []recovery.Timing `json:"recoveries"`
	}{runID, rs}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, RecoveryFile), append(b, '\n'))
}

// maxErrorFile bounds what is read of a worker's error file.
const maxErrorFile = 64 << 10

// ErrorFileNote reads the error file a PyTorch entry point decorated with
// torch.distributed.elastic's @record writes when it fails (at
// TORCHELASTIC_ERROR_FILE, jobenv.Vars.ErrorFile) and returns it as a note
// for the root cause: the exception and the last lines of its Python stack.
// ok is false when there is no such file or it is not one.
func ErrorFileNote(path string) (note string, ok bool) {
	if path == "" {
		return "", false
	}
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxErrorFile))
	if err != nil {
		return "", false
	}
	// torch writes {"message": {"message": "...", "extraInfo":
	// {"py_callstack": "...", "timestamp": "..."}}}; older versions a
	// plain string message.
	var doc struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(b, &doc) != nil || len(doc.Message) == 0 {
		return "", false
	}
	var msg, stack string
	var inner struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
		} `json:"extraInfo"`
	}
	if json.Unmarshal(doc.Message, &inner) == nil && inner.Message != "" {
		msg, stack = inner.Message, inner.ExtraInfo.PyCallstack
	} else if json.Unmarshal(doc.Message, &msg) != nil || msg == "" {
		return "", false
	}
	note = "the program's error file (torch.distributed.elastic @record): " + strings.TrimSpace(msg)
	if lines := strings.Split(strings.TrimRight(stack, "\n"), "\n"); stack != "" {
		note += "\n" + strings.Join(lines[max(0, len(lines)-6):], "\n")
	}
	return note, true
}
