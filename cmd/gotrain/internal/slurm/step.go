package slurm

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/launcher"
)

// The variables a step is read from (srun sets them in every task).
const (
	EnvJobID        = "SLURM_JOB_ID"
	EnvStepID       = "SLURM_STEP_ID"
	EnvStepNodeList = "SLURM_STEP_NODELIST"
	EnvStepNumNodes = "SLURM_STEP_NUM_NODES"
	EnvNodeID       = "SLURM_NODEID"
	EnvLocalID      = "SLURM_LOCALID"
	EnvTasksPerNode = "SLURM_STEP_TASKS_PER_NODE"
	EnvRestartCount = "SLURM_RESTART_COUNT"
	// EnvOff, set to "off" (or "0"), makes gotrain ignore Slurm's variables.
	EnvOff = "GOTRAIN_SLURM"
)

// Port range of the derived ports: below Linux's ephemeral ports (32768
// and up), four ports a step: the coordinator's, its gossip (+1), the token
// exchange (+2), one spare.
const (
	portBase  = 20000
	portSlots = (32768 - portBase) / 4
)

// ErrStep is wrapped by the errors of FromEnv: the variables say a step but
// not a coherent one.
var ErrStep = errors.New("slurm: inconsistent step variables")

// Step is this task's place in a Slurm job step.
type Step struct {
	JobID, StepID uint64
	// Nodes are the step's nodes in Slurm's node order
	// (SLURM_STEP_NODELIST expanded; not the job's, which may be larger).
	Nodes []string
	// NodeID is this node's index in Nodes (SLURM_NODEID).
	NodeID int
	// LocalID is this task's index among the step's tasks on this node
	// (SLURM_LOCALID); the task with 0 runs the node's agent.
	LocalID int
	// TasksOnNode is how many tasks of the step run on this node.
	TasksOnNode int
	// RestartCount is how many times the job was requeued (SLURM_RESTART_COUNT).
	RestartCount int
}

// FromEnv reads the step this process is a task of; nil (and no error)
// outside a step: no SLURM_JOB_ID or SLURM_STEP_ID (a batch script itself,
// an salloc shell), or GOTRAIN_SLURM=off.
func FromEnv(getenv func(string) string) (*Step, error) {
	if v := getenv(EnvOff); v == "off" || v == "0" || v == "false" {
		return nil, nil
	}
	if getenv(EnvJobID) == "" || getenv(EnvStepID) == "" || getenv(EnvStepNodeList) == "" {
		return nil, nil
	}
	var s Step
	var err error
	num := func(name string, dst *uint64) {
		if err != nil {
			return
		}
		v, e := strconv.ParseUint(getenv(name), 10, 64)
		if e != nil {
			err = fmt.Errorf("%w: %s=%q is not a number", ErrStep, name, getenv(name))
		}
		*dst = v
	}
	var nodeID, localID, numNodes uint64
	num(EnvJobID, &s.JobID)
	num(EnvStepID, &s.StepID)
	num(EnvNodeID, &nodeID)
	num(EnvLocalID, &localID)
	if getenv(EnvStepNumNodes) != "" {
		num(EnvStepNumNodes, &numNodes)
	}
	if err != nil {
		return nil, err
	}
	if s.Nodes, err = ExpandHostlist(getenv(EnvStepNodeList)); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStep, EnvStepNodeList, err)
	}
	if numNodes != 0 && numNodes != uint64(len(s.Nodes)) {
		return nil, fmt.Errorf("%w: %s=%d but %s names %d nodes", ErrStep, EnvStepNumNodes, numNodes, EnvStepNodeList, len(s.Nodes))
	}
	if nodeID >= uint64(len(s.Nodes)) {
		return nil, fmt.Errorf("%w: %s=%d but the step has %d nodes", ErrStep, EnvNodeID, nodeID, len(s.Nodes))
	}
	s.NodeID, s.LocalID, s.TasksOnNode = int(nodeID), int(localID), 1
	if v := getenv(EnvTasksPerNode); v != "" {
		tasks, err := ParseTasksPerNode(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrStep, EnvTasksPerNode, err)
		}
		if len(tasks) != len(s.Nodes) {
			return nil, fmt.Errorf("%w: %s=%q counts %d nodes, the step has %d", ErrStep, EnvTasksPerNode, v, len(tasks), len(s.Nodes))
		}
		s.TasksOnNode = tasks[s.NodeID]
	}
	if s.LocalID >= s.TasksOnNode {
		return nil, fmt.Errorf("%w: %s=%d but this node runs %d task(s) of the step", ErrStep, EnvLocalID, s.LocalID, s.TasksOnNode)
	}
	if v := getenv(EnvRestartCount); v != "" {
		if s.RestartCount, err = strconv.Atoi(v); err != nil || s.RestartCount < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a count", ErrStep, EnvRestartCount, v)
		}
	}
	return &s, nil
}

// Port is the coordinator's port of the step, derived from the job and
// step ids so that every node computes the same one and neighbouring jobs
// and the steps of one job (up to 8 at once) differ: 20000 + 4·((8·job +
// step) mod 3192). Its gossip uses Port+1, the token exchange Port+2.
func (s *Step) Port() int {
	return portBase + 4*int((s.JobID*8+s.StepID)%portSlots)
}

// ExchangePort is where node 0's agent hands the job token out (Port+2).
func (s *Step) ExchangePort() int { return s.Port() + 2 }

// Head is the step's first node: its agent runs the coordinator.
func (s *Step) Head() string { return s.Nodes[0] }

// String names the step as Slurm does: JOB.STEP.
func (s *Step) String() string { return fmt.Sprintf("%d.%d", s.JobID, s.StepID) }

// Apply turns s into cfg's settings where the command line (given: the
// flags set, by name) left them out:
//   - --nnodes: the step's node count;
//   - --coordinator: node 0 starts it (listening on 0.0.0.0:Port), every
//     other node joins HEAD:Port;
//   - --nproc-per-node: with several tasks of the step on this node, one
//     worker per task (see Run);
//   - --run-id: slurm-JOB.STEP;
//   - the restart count workers see (GOTRAIN_RESTART_COUNT,
//     TORCHELASTIC_RESTART_COUNT) starts at SLURM_RESTART_COUNT, so a
//     requeued job counts on from its earlier runs (only node 0's
//     coordinator uses it).
//
// The job token is not Apply's: Run gets it (exchange.go). A nil s
// changes nothing.
func (s *Step) Apply(cfg *launcher.Config, given map[string]bool) {
	if s == nil {
		return
	}
	if !given[host.FlagNodes] {
		cfg.Nodes, cfg.MinNodes = len(s.Nodes), len(s.Nodes)
	}
	if len(s.Nodes) > 1 && !given["coordinator"] && !given["coordinator-listen"] {
		port := strconv.Itoa(s.Port())
		if s.NodeID == 0 {
			cfg.Coordinator, cfg.CoordinatorListen = "", net.JoinHostPort("0.0.0.0", port)
		} else {
			// A node asked to host a replica of the coordinator serves it
			// at the same port.
			cfg.Coordinator, cfg.CoordinatorListen = net.JoinHostPort(s.Head(), port), net.JoinHostPort("0.0.0.0", port)
		}
	}
	if cfg.NprocPerNode == 0 && s.TasksOnNode > 1 {
		cfg.NprocPerNode = s.TasksOnNode
	}
	if !given[host.FlagRunID] && cfg.RunID == "" {
		cfg.RunID = "slurm-" + s.String()
	}
	cfg.RestartCountBase = s.RestartCount
	if !given["node-rank"] {
		nodeRank := s.NodeID // the job's node order is the step's (SLURM_NODEID)
		cfg.NodeRank = &nodeRank
	}
	cfg.Scheduled = true // nothing printed is to be copied by hand
}

// Summary is one line saying what was taken from Slurm, for --verbose.
func (s *Step) Summary(cfg *launcher.Config) string {
	role := "joins the coordinator at " + cfg.Coordinator
	if cfg.Coordinator == "" {
		role = "runs the coordinator at " + cfg.CoordinatorListen
	}
	return fmt.Sprintf("slurm step %s: node %d of %d (%s), %d task(s) here; this agent %s",
		s, s.NodeID, len(s.Nodes), strings.Join(s.Nodes, ","), s.TasksOnNode, role)
}
