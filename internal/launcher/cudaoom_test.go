package launcher

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/launcher/relay"
	"github.com/gotrain/gotrain/internal/launcher/supervise"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// sleeper starts a process that waits, killed when the test ends.
func sleeper(t *testing.T, sup *supervise.Supervisor) *supervise.Proc {
	t.Helper()
	p, err := sup.Start(supervise.Spec{Path: "sleep", Args: []string{"600"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Signal(syscall.SIGKILL); <-p.Done() })
	return p
}

// A rank's CUDA out-of-memory: the GPU's memory note names gotrain's own
// processes on it, and the same one at the same place in a later
// generation is permanent and repeated (unless --retry-permanent).
func TestExamineCUDAOOM(t *testing.T) {
	sup, err := supervise.New(supervise.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	standby, peer := sleeper(t, sup), sleeper(t, sup)
	fake := &gpuinfo.Fake{
		Devices: []gpuinfo.Device{{Index: 0}, {Index: 1}},
		Samples: []gpuinfo.Sample{{}, {MemoryUsed: 3 << 30, MemoryTotal: 80 << 30}},
		Procs: [][]gpuinfo.Process{nil, {{PID: standby.Pid(), UsedMemory: 520 << 20}, {PID: peer.Pid(), UsedMemory: 1 << 30},
			{PID: 1 << 22, Name: "python3", UsedMemory: 1 << 30}}},
	}
	old := openNVML
	openNVML = func() (gpuinfo.NVML, error) { return fake, nil }
	t.Cleanup(func() { openNVML = old })

	a := &agent{reg: &registry{procs: map[agentcore.ProcID]*workerProc{
		1: {proc: standby, who: relay.Proc{Standby: true, Slot: 1}, py: &pystandby.Link{}},
		2: {proc: peer, who: relay.Proc{Rank: 5}},
	}}}
	tail := []string{"Traceback (most recent call last):", `  File "/t/train.py", line 9, in step`, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."}
	exit := func(gen int64) *gotrainv1.ReportWorkerExitRequest {
		req := &gotrainv1.ReportWorkerExitRequest{Generation: gen, Rank: 3, Pid: 99, ExitCode: 1, StderrTail: tail}
		a.examineCUDAOOM(req, &workerProc{gpu: 1})
		return req
	}
	first := exit(0)
	want := fmt.Sprintf("GPU 1 just after the exit: 3.0 GiB of 80.0 GiB in use; held by gotrain's Python standby for slot 1 (pid %d, 520 MiB), rank 5 of this job (pid %d, 1.0 GiB), another process python3 (pid %d, 1.0 GiB)",
		standby.Pid(), peer.Pid(), 1<<22)
	if len(first.Notes) != 1 || first.Notes[0] != want {
		t.Errorf("notes %q\nwant %q", first.Notes, want)
	}
	if first.Permanent != "" || first.Repeated {
		t.Errorf("the first OOM is permanent: %q", first.Permanent)
	}
	second := exit(1)
	if !second.Repeated || !strings.Contains(second.Permanent, "rank 3 ran out of GPU memory in generation 0 and rank 3 in generation 1, both at /t/train.py:9 in step") {
		t.Errorf("the second OOM at the same place: permanent %q, repeated %v", second.Permanent, second.Repeated)
	}
	a.cfg.RetryPermanent = true
	if third := exit(2); third.Permanent != "" || third.Repeated {
		t.Errorf("--retry-permanent: permanent %q", third.Permanent)
	}
	// Not an OOM: nothing added.
	req := &gotrainv1.ReportWorkerExitRequest{Generation: 3, Rank: 3, Pid: 99, ExitCode: 1, StderrTail: []string{"ValueError: x"}}
	a.examineCUDAOOM(req, &workerProc{gpu: 1})
	if len(req.Notes) != 0 || req.Permanent != "" {
		t.Errorf("a ValueError got %q, %q", req.Notes, req.Permanent)
	}
}
