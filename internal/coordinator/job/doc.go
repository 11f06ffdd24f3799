// Package job is the job state machine of the gotrain coordinator: which nodes
// belong to the job, which ranks run where, which generation is running, when a
// generation ends, when the job restarts and when it is over.
//
// The package is pure: it never dials, spawns, sleeps or reads the clock. Events
// go in through [Machine.Step] together with the current time; the actions the
// caller must carry out come back as its result. The gRPC server in package
// coordinator is the caller in production; the transcript tests in testdata/
// are the other one.
//
// # Lifecycle
//
// The job waits until [Config.Nodes] nodes have joined, then opens generation 0
// with a [StartGeneration]. A worker that exits with code 0 is done; when every
// rank is done the job finishes successfully ([FinishJob]). The first bad exit
// (a non-zero code or a signal), or the loss of a node, ends the generation
// ([EndGeneration]) and becomes the root cause. The agents then stop their
// workers and report those exits, which are expected and never replace the
// root cause. Once every rank of the ended generation is accounted for, the
// machine starts the next generation if restarts remain and every node is
// still there, and finishes the job as failed otherwise.
//
// # Usage
//
//	m, err := job.New(job.Config{RunID: "run-1", Nodes: 2, MaxRestarts: 3})
//	if err != nil { ... }
//	acts, err := m.Step(now, job.NodeJoined{NodeID: "n1", Info: info})
//	if err != nil { ... } // the event was rejected; the machine did not change
//	for _, a := range acts {
//		switch a := a.(type) {
//		case job.StartGeneration: // tell every node's agent to start its ranks
//		case job.EndGeneration:   // tell every agent to stop its workers
//		case job.FinishJob:       // tell every agent the job is over
//		case job.ReleaseBarrier:  // answer the waiting Barrier calls
//		case job.FailBarrier:     // fail the waiting Barrier calls
//		}
//	}
package job
