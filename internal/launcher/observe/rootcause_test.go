package observe

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestParseOOMKills(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2, true}, // cgroup v2 memory.events
		{"oom_kill_disable 0\nunder_oom 0\noom_kill 17\n", 17, true},             // v1 memory.oom_control
		{"oom_kill_disable 0\nunder_oom 0\n", 0, false},
		{"oom_kill x\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parseOOMKills([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseOOMKills(%q) = %d, %t; want %d, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMemoryEventsFile(t *testing.T) {
	root := t.TempDir()
	write := func(rel, data string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := write("sys/job.slice/memory.events", "oom 0\noom_kill 0\n")
	write("proc-v2", "0::/job.slice\n")
	if got := memoryEventsFile(filepath.Join(root, "proc-v2"), filepath.Join(root, "sys")); got != v2 {
		t.Errorf("v2: got %q, want %q", got, v2)
	}
	v1 := write("sys/memory/box/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	write("proc-v1", "9:name=systemd:/\n4:memory:/box\n0::/\n")
	if got := memoryEventsFile(filepath.Join(root, "proc-v1"), filepath.Join(root, "sys")); got != v1 {
		t.Errorf("v1: got %q, want %q", got, v1)
	}
	if got := memoryEventsFile(filepath.Join(root, "missing"), root); got != "" {
		t.Errorf("missing: got %q", got)
	}
}

func TestScanKernelLog(t *testing.T) {
	var recs []kernelRecord
	for _, raw := range []string{
		"6,100,1000000,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n", // before the start
		"3,101,5000000,-;Memory cgroup out of memory: Killed process 4242 (train) total-vm:1kB, anon-rss:1kB\n",
		"6,102,5000001,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=train,pid=4243,uid=0\n",
		"3,103,5000002,-;Out of memory: Killed process 999 (other) total-vm:1kB\n", // another process
		"4,104,6000000,-;NVRM: Xid (PCI:0000:00:07): 13, pid=4242, Graphics Exception\n SUBSYSTEM=pci\n",
		"garbage without a separator",
		"6,105,notanumber,-;NVRM: Xid nope\n",
	} {
		if r, ok := parseKmsg([]byte(raw)); ok {
			recs = append(recs, r)
		}
	}
	if len(recs) != 5 {
		t.Fatalf("parsed %d records, want 5", len(recs))
	}
	oom, xids := scanKernelLog(recs, 2*time.Second, map[int]bool{4242: true, 4243: true})
	if len(oom) != 2 || !strings.Contains(oom[0], "4242") || !strings.Contains(oom[1], "pid=4243") {
		t.Errorf("oom = %q", oom)
	}
	if len(xids) != 1 || !strings.Contains(xids[0], "Xid (PCI:0000:00:07): 13") {
		t.Errorf("xids = %q", xids)
	}
}

func FuzzParseKmsg(f *testing.F) {
	f.Add([]byte("6,1,2,-;hello\n"))
	f.Add([]byte(";"))
	f.Add([]byte("1,2,-3,;x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := parseKmsg(b)
		if ok && (r.at < 0 || strings.Contains(r.msg, "\n")) {
			t.Errorf("parseKmsg(%q) = %+v", b, r)
		}
	})
}

func TestWriteRootCause(t *testing.T) {
	dir := t.TempDir()
	fl := &gotrainv1.WorkerFailure{Rank: 3, Hostname: "h", Pid: 7, ExitCode: -1, Signal: "SIGKILL", OomKilled: true,
		StderrTail: []string{"a", "b"}}
	if err := writeRootCause(dir, rootCauseReport{RunID: "r", ExitCode: 137, Message: "m", Failure: failureJSON(fl)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, RootCauseFile))
	if err != nil {
		t.Fatal(err)
	}
	var got rootCauseReport
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Failure == nil || got.Failure.Rank != 3 || !got.Failure.OOMKilled || got.ExitCode != 137 || len(got.Failure.StderrTail) != 2 {
		t.Errorf("got %+v", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) > 0 {
		t.Errorf("temp files left: %v", left)
	}
}

// The error file that torch.distributed.elastic's @record writes reaches
// the root cause: the exception and the end of its Python stack.
func TestErrorFileNote(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "error.json")
	if _, ok := ErrorFileNote(path); ok {
		t.Error("a note without an error file")
	}
	doc := `{"message": {"message": "RuntimeError: loss is NaN", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 9, in main\n    raise RuntimeError(\"loss is NaN\")\nRuntimeError: loss is NaN\n", "timestamp": "1733000000"}}}`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	note, ok := ErrorFileNote(path)
	if !ok || !strings.Contains(note, "@record): RuntimeError: loss is NaN") || !strings.Contains(note, `File "train.py", line 9`) {
		t.Errorf("note %q, %v", note, ok)
	}
	if err := os.WriteFile(path, []byte(`{"message": "plain text"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if note, ok := ErrorFileNote(path); !ok || !strings.HasSuffix(note, "plain text") {
		t.Errorf("plain message: %q, %v", note, ok)
	}
	if err := os.WriteFile(path, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := ErrorFileNote(path); ok {
		t.Error("a note from a file that is not torch's")
	}
}
