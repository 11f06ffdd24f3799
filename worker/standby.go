package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobenv/genwire"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// Hot standbys (gotrain launch --standby), the worker's half. The agent
// starts a spare process of the program per local slot before any rank
// needs it, with GOTRAIN_STANDBY=1 and the job's variables but no rank.
// Init then prewarms the slot's GPU (NCCL backend), attaches to the agent
// with hello{standby} and blocks. When a rank of the slot needs a new
// process, the agent sends the rank's variables on that stream: Init sets
// them in the process's environment (so code that reads RANK, WORLD_SIZE,
// GOTRAIN_* ... later sees what a worker started for the rank sees), closes
// the standby's stream and goes on as for any worker. Everything the
// program does before Init runs ahead of need, which is the point; it must
// not depend on the rank.

// dialAgent makes the connection to the agent's socket.
func dialAgent(socket, jobToken string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		token.DialOption(jobToken))
}

// awaitAssignment does nothing and returns nil unless this process is a
// standby. A standby waits until the agent gives it a rank, sets the rank's
// environment, and returns its connection to the agent, for Init to keep.
func awaitAssignment(ctx context.Context, opts []Option) (*grpc.ClientConn, error) {
	if !jobenv.IsStandby(os.Getenv) {
		return nil, nil
	}
	sv, err := jobenv.StandbyFromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	o := &Worker{logger: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(o)
	}
	log := o.logger.With("standby_slot", sv.Slot)
	if sv.Backend == "nccl" && !o.noPrewarm {
		// A standby has time to spare: it also does NCCL's once-per-process
		// work (GOTRAIN_STANDBY_WARM_COMM=0 leaves it to the first real
		// communicator, for A/B measurements).
		if os.Getenv(jobenv.StandbyWarmComm) == "0" {
			ncclcomm.Prewarm(ncclcomm.DeviceFor(sv.GPU, os.Getenv))
		} else {
			ncclcomm.PrewarmComm(ncclcomm.DeviceFor(sv.GPU, os.Getenv))
		}
	}
	conn, err := dialAgent(sv.AgentSocket, sv.JobToken)
	if err != nil {
		return nil, fmt.Errorf("worker: standby for slot %d: connect to agent at %s: %w", sv.Slot, sv.AgentSocket, err)
	}
	log.Debug("standby waiting for a rank")
	assign, err := waitForRank(ctx, gotrainv1.NewAgentClient(conn), sv.Slot)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("worker: standby for slot %d: %w", sv.Slot, err)
	}
	v, ok := jobenv.Identity(genwire.Generation(assign.GetGeneration()), int(assign.GetRank()), sv.Node())
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("worker: standby for slot %d: assigned rank %d, which generation %d does not run on this node", sv.Slot, assign.GetRank(), assign.GetGeneration().GetGeneration())
	}
	if err := adoptIdentity(v, os.Setenv, os.Unsetenv); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("worker: standby for slot %d: %w", sv.Slot, err)
	}
	log.Debug("standby assigned", "rank", os.Getenv(jobenv.Rank))
	return conn, nil
}

// waitForRank says hello{standby} on a control stream of its own and
// returns the agent's assignment: a rank and its generation.
func waitForRank(ctx context.Context, agent gotrainv1.AgentClient, slot int) (*gotrainv1.StandbyAssignment, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := agent.Attach(sctx)
	if err != nil {
		return nil, fmt.Errorf("attach to the agent: %w", err)
	}
	hello := &gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Hello{Hello: &gotrainv1.WorkerHello{
		Rank: -1, Pid: int32(os.Getpid()), Generation: -1, Standby: true, StandbySlot: int32(slot),
	}}}
	if err := stream.Send(hello); err != nil {
		return nil, fmt.Errorf("attach to the agent: hello: %w", err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the agent ended the standby's stream before assigning a rank (did gotrain launch exit, or was it started without --standby?): %w", err)
		}
		if a := m.GetAssign(); a != nil {
			_ = stream.CloseSend()
			return a, nil
		}
	}
}
