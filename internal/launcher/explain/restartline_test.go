package explain

import (
	"strings"
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestRestartLineText(t *testing.T) {
	for _, tc := range []struct {
		p    *gotrainv1.RestartPlanned
		want string
	}{
		{&gotrainv1.RestartPlanned{WorldSize: 8, Attempt: 2, MaxAttempts: 4, WaitMs: 400, Failure: &gotrainv1.WorkerFailure{
			Rank: 2, Hostname: "node3", Pid: 77, ExitCode: 1,
			StderrTail: []string{"Traceback (most recent call last):", `  File "t.py", line 1`, "ImportError: no module named foo"}}},
			"gotrain: rank 2 on node3 exited 1 (ImportError: no module named foo): restarting all 8 ranks, attempt 2 of 4, in 0.4 s"},
		{&gotrainv1.RestartPlanned{WorldSize: 1, Attempt: 3, MaxAttempts: 4, WaitMs: 2000, Failure: &gotrainv1.WorkerFailure{
			Hostname: "a", Pid: 5, ExitCode: -1, Signal: "SIGKILL", OomKilled: true}},
			"gotrain: rank 0 on a was killed by the kernel's OOM killer: restarting the job's one rank, attempt 3 of 4, in 2 s"},
		{&gotrainv1.RestartPlanned{WorldSize: 2, Attempt: 2, MaxAttempts: 2, Failure: &gotrainv1.WorkerFailure{
			Hostname: "a", Pid: 5, ExitCode: -1, Signal: "SIGSEGV", StderrTail: []string{"panic: runtime error: index out of range", "", "goroutine 1 [running]:", "main.main()"}}},
			"gotrain: rank 0 on a was killed by SIGSEGV (panic: runtime error: index out of range): restarting all 2 ranks, attempt 2 of 2, now"},
		// Killed from outside: the signal is the cause, not a library's
		// last warning; an exit with the same tail quotes it.
		{&gotrainv1.RestartPlanned{WorldSize: 1, Attempt: 2, MaxAttempts: 4, Failure: &gotrainv1.WorkerFailure{
			Hostname: "gpu1", Pid: 5, ExitCode: -1, Signal: "SIGKILL", StderrTail: []string{"step 10", "[transformers] mtime may not be reliable on this filesystem, falling back to repo_etag"}}},
			"gotrain: rank 0 on gpu1 was killed by SIGKILL: restarting the job's one rank, attempt 2 of 4, now"},
		{&gotrainv1.RestartPlanned{WorldSize: 1, Attempt: 2, MaxAttempts: 4, Failure: &gotrainv1.WorkerFailure{
			Hostname: "gpu1", Pid: 5, ExitCode: -1, Signal: "SIGTERM", StderrTail: []string{"RuntimeError: NCCL communicator was aborted", "[transformers] mtime may not be reliable"}}},
			"gotrain: rank 0 on gpu1 was killed by SIGTERM (RuntimeError: NCCL communicator was aborted): restarting the job's one rank, attempt 2 of 4, now"},
		{&gotrainv1.RestartPlanned{WorldSize: 1, Attempt: 2, MaxAttempts: 4, Failure: &gotrainv1.WorkerFailure{
			Hostname: "gpu1", Pid: 5, ExitCode: 3, StderrTail: []string{"step 10", "cannot continue: bad batch"}}},
			"gotrain: rank 0 on gpu1 exited 3 (cannot continue: bad batch): restarting the job's one rank, attempt 2 of 4, now"},
		// A CUDA out-of-memory is named as such, quoting torch's line, not
		// the last line of its advice.
		{&gotrainv1.RestartPlanned{WorldSize: 8, Attempt: 2, MaxAttempts: 4, Failure: &gotrainv1.WorkerFailure{
			Rank: 5, Hostname: "gpu1", Pid: 5, ExitCode: 1, StderrTail: []string{"Traceback (most recent call last):", `  File "t.py", line 9, in step`,
				"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "CUDA kernel errors might be asynchronously reported"}}},
			"gotrain: rank 5 on gpu1 ran out of GPU memory (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.): restarting all 8 ranks, attempt 2 of 4, now"},
		{&gotrainv1.RestartPlanned{WorldSize: 4, Attempt: 2, MaxAttempts: 4, Failure: &gotrainv1.WorkerFailure{
			NodeId: "node-2", Hostname: "b", Reason: "out of contact for 30s"}},
			"gotrain: node node-2 on b was lost (out of contact for 30s): restarting the job, attempt 2 of 4, now"},
	} {
		if got := RestartLine(tc.p); got != tc.want {
			t.Errorf("RestartLine\n got %s\nwant %s", got, tc.want)
		}
	}
}

func TestPermanentCause(t *testing.T) {
	tb := []string{"Traceback (most recent call last):", `  File "/x/train.py", line 1, in <module>`}
	for _, tc := range []struct {
		spawnErr string
		tail     []string
		want     string
	}{
		{"fork/exec ./t: exec format error", nil, "the program cannot be executed: not a program for this machine (exec format error)"},
		{"fork/exec ./t: permission denied", nil, "the program cannot be executed: not executable (permission denied)"},
		{"fork/exec ./t: no such file or directory", nil, "the program cannot be executed: not found"},
		{"fork/exec ./t: resource temporarily unavailable", nil, ""}, // may pass
		{"", append(tb, "ModuleNotFoundError: No module named 'foo'"), "the Python program failed with ModuleNotFoundError: No module named 'foo'"},
		{"", append(tb, "    x = (", "        ^", "SyntaxError: '(' was never closed", ""), "the Python program failed with SyntaxError: '(' was never closed"},
		{"", []string{"ImportError: no module named foo"}, ""}, // no traceback: not Python's
		{"", append(tb, "RuntimeError: CUDA error: out of memory"), ""},
		{"", append(tb, "ImportError: x", "RuntimeError: later"), ""}, // the last error decides
	} {
		if got := PermanentCause(tc.spawnErr, tc.tail); got != tc.want {
			t.Errorf("PermanentCause(%q, %q) = %q, want %q", tc.spawnErr, tc.tail, got, tc.want)
		}
	}
}

func TestJoinedLine(t *testing.T) {
	g := &gotrainv1.GenerationStarted{WorldSize: 16, GroupWorldSize: 2, GroupRank: 1,
		Ranks: []*gotrainv1.RankAssignment{{Rank: 8}, {Rank: 9}, {Rank: 10}, {Rank: 11}, {Rank: 12}, {Rank: 13}, {Rank: 14}, {Rank: 15}}}
	if got, want := JoinedLine("gotrain-1234", "node2", g), "gotrain: joined run gotrain-1234: 16 ranks on 2 nodes; this node (node2) runs ranks 8-15"; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	for ranks, want := range map[string][]int{"rank 3": {3}, "ranks 1, 4, 7": {1, 4, 7}, "no ranks": nil} {
		if got := rankList(want); got != ranks {
			t.Errorf("rankList(%v) = %q, want %q", want, got, ranks)
		}
	}
}

func TestDescribeCUDAOOM(t *testing.T) {
	f := &gotrainv1.JobFinished{Message: "job failed in generation 1: ...", Failure: &gotrainv1.WorkerFailure{
		Rank: 5, Hostname: "gpu1", Pid: 77, ExitCode: 1, Notes: []string{"GPU 5 just after the exit: 1.0 GiB of 80.0 GiB in use"},
		StderrTail: []string{"RuntimeError: CUDA error: out of memory"}}}
	got := DescribeFailure(f)
	for _, want := range []string{
		"gotrain: job failed: rank 5 on gpu1 (pid 77) ran out of GPU memory (exit status 1)\n",
		"\n  evidence: GPU 5 just after the exit: 1.0 GiB of 80.0 GiB in use\n",
		"\n  to fit: a smaller batch per GPU, mixed precision",
		"--standby off frees it",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("DescribeFailure lacks %q:\n%s", want, got)
		}
	}
	// Killed by a signal: the signal is the cause.
	f.Failure.Signal, f.Failure.ExitCode = "SIGKILL", -1
	if got := DescribeFailure(f); strings.Contains(got, "GPU memory") {
		t.Errorf("a rank killed by SIGKILL is said to have run out of GPU memory:\n%s", got)
	}
}

func TestSizeLine(t *testing.T) {
	gen := func(ranksPerNode int32, nodes ...string) *gotrainv1.GenerationStarted {
		g := &gotrainv1.GenerationStarted{GroupWorldSize: int32(len(nodes)), WorldSize: ranksPerNode * int32(len(nodes))}
		for i, n := range nodes {
			g.Nodes = append(g.Nodes, &gotrainv1.GenerationNode{NodeId: n, GroupRank: int32(i)})
		}
		return g
	}
	for _, tc := range []struct {
		prev, next *gotrainv1.GenerationStarted
		want       string
	}{
		{gen(1, "node-1", "node-2", "node-3", "node-4"), gen(1, "node-1", "node-2", "node-4"), "gotrain: going on with 3 nodes (3 ranks)"},
		{gen(1, "node-1", "node-2", "node-4"), gen(1, "node-1", "node-2", "node-4", "node-5"), "gotrain: node-5 joined: the job grows to 4 nodes (4 ranks)"},
		{gen(2, "node-1"), gen(2, "node-1", "node-2", "node-3"), "gotrain: node-2, node-3 joined: the job grows to 3 nodes (6 ranks)"},
		{gen(8, "node-1", "node-2"), gen(8, "node-2"), "gotrain: going on with 1 node (8 ranks)"},
		{gen(1, "node-1", "node-2"), gen(1, "node-1", "node-3"), ""}, // a node in another's place: the restart line said it
		{nil, gen(1, "node-1"), ""},
	} {
		if got := SizeLine(tc.prev, tc.next); got != tc.want {
			t.Errorf("SizeLine\n got %q\nwant %q", got, tc.want)
		}
	}
}
