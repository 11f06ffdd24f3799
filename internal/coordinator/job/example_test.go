package job_test

import (
	"fmt"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// A one-node job whose only worker fails once and then succeeds.
func Example() {
	m, err := job.New(job.Config{RunID: "run-1", Nodes: 1, MaxRestarts: 1})
	if err != nil {
		panic(err)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	events := []job.Event{
		job.NodeJoined{NodeID: "n1", Info: job.NodeInfo{Hostname: "gpu-a", Address: "10.0.0.1", Nproc: 1, FreePort: 29500}},
		job.WorkerExited{NodeID: "n1", Generation: 0, Rank: 0, Pid: 7, ExitCode: 1},
		job.WorkerExited{NodeID: "n1", Generation: 1, Rank: 0, Pid: 8, ExitCode: 0},
	}
	for _, ev := range events {
		acts, err := m.Step(now, ev)
		if err != nil {
			panic(err)
		}
		for _, a := range acts {
			switch a := a.(type) {
			case job.StartGeneration:
				fmt.Printf("start generation %d (restart %d), master %s:%d\n", a.Generation, a.RestartCount, a.MasterAddr, a.MasterPort)
			case job.EndGeneration:
				fmt.Printf("end generation %d: %s\n", a.Generation, a.Reason)
			case job.FinishJob:
				fmt.Printf("finish: exit code %d: %s\n", a.ExitCode, a.Message)
			}
		}
	}
	// Output:
	// start generation 0 (restart 0), master 10.0.0.1:29500
	// end generation 0: rank 0 (pid 7) on gpu-a exited with code 1
	// start generation 1 (restart 1), master 10.0.0.1:29500
	// finish: exit code 0: job succeeded: 1 rank exited with code 0 in generation 1 after 1 restart
}
