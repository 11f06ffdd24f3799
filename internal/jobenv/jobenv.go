// Package jobenv is the contract between the agent and the processes it starts:
// the environment variables that tell a worker who it is and how to reach its
// agent. The agent writes them with Vars.Environ; package worker reads them with
// FromEnv. The torchrun-compatible names are written too, so that PyTorch
// programs run unchanged.
package jobenv

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/torchhook"
)

// Names of the variables gotrain sets for every worker.
const (
	Rank           = "GOTRAIN_RANK"
	WorldSize      = "GOTRAIN_WORLD_SIZE"
	LocalRank      = "GOTRAIN_LOCAL_RANK"
	LocalWorldSize = "GOTRAIN_LOCAL_WORLD_SIZE"
	GroupRank      = "GOTRAIN_GROUP_RANK"
	Generation     = "GOTRAIN_GENERATION"
	RestartCount   = "GOTRAIN_RESTART_COUNT"
	Agent          = "GOTRAIN_AGENT" // unix socket path of the worker's agent
	JobToken       = "GOTRAIN_JOB_TOKEN"
	RunID          = "GOTRAIN_RUN_ID"
	Backend        = "GOTRAIN_BACKEND" // "cpu" or "nccl"
	Host           = "GOTRAIN_HOST"    // the node's address, as peers reach it
	GPU            = "GOTRAIN_GPU"     // GPU index on the node, -1 for none
)

// Vars is everything a worker is told about its place in the job.
type Vars struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	GroupRank                 int
	Generation                int64
	RestartCount              int
	AgentSocket               string
	JobToken                  string
	RunID                     string
	Backend                   string
	Host                      string
	GPU                       int
	MasterAddr                string
	MasterPort                int
}

// Environ returns the variables as KEY=VALUE pairs: gotrain's own, the
// torchrun-compatible ones, and settings every GPU worker must keep.
func (v Vars) Environ() []string {
	itoa := strconv.Itoa
	env := []string{
		Rank + "=" + itoa(v.Rank),
		WorldSize + "=" + itoa(v.WorldSize),
		LocalRank + "=" + itoa(v.LocalRank),
		LocalWorldSize + "=" + itoa(v.LocalWorldSize),
		GroupRank + "=" + itoa(v.GroupRank),
		Generation + "=" + strconv.FormatInt(v.Generation, 10),
		RestartCount + "=" + itoa(v.RestartCount),
		Agent + "=" + v.AgentSocket,
		JobToken + "=" + v.JobToken,
		RunID + "=" + v.RunID,
		Backend + "=" + v.Backend,
		Host + "=" + v.Host,
		GPU + "=" + itoa(v.GPU),
		// torchrun's names.
		"RANK=" + itoa(v.Rank),
		"LOCAL_RANK=" + itoa(v.LocalRank),
		"WORLD_SIZE=" + itoa(v.WorldSize),
		"LOCAL_WORLD_SIZE=" + itoa(v.LocalWorldSize),
		"GROUP_RANK=" + itoa(v.GroupRank),
		"MASTER_ADDR=" + v.MasterAddr,
		"MASTER_PORT=" + itoa(v.MasterPort),
		"TORCHELASTIC_RUN_ID=" + v.RunID,
		"TORCHELASTIC_RESTART_COUNT=" + itoa(v.RestartCount),
		"GROUP_WORLD_SIZE=" + itoa(v.groupWorldSize()),
		"ROLE_NAME=" + RoleName,
		"ROLE_RANK=" + itoa(v.Rank),
		"ROLE_WORLD_SIZE=" + itoa(v.WorldSize),
		TorchErrorFile + "=" + v.ErrorFile(),
		// Rank 0 hosts the TCPStore (torchrun says False for its c10d
		// rendezvous, True where its agent hosts the store).
		"TORCHELASTIC_USE_AGENT_STORE=False",
		// NVLink multicast (NVLS) can take a shared host's GPUs down; gotrain
		// never enables it.
		"NCCL_NVLS_ENABLE=0",
	}
	return env
}

// RoleName is the one role of a gotrain job, as torchrun names it.
const RoleName = "default"

// TorchErrorFile names the file where a worker's @record entry point
// (torch.distributed.elastic.multiprocessing.errors) writes its error.
const TorchErrorFile = "TORCHELASTIC_ERROR_FILE"

// groupWorldSize is the number of nodes, as torchrun counts them: every node
// runs the same number of workers.
func (v Vars) groupWorldSize() int {
	if v.LocalWorldSize < 1 {
		return 1
	}
	return max(1, v.WorldSize/v.LocalWorldSize)
}

// ErrorFile is the rank's TORCHELASTIC_ERROR_FILE for this generation: in
// its agent's private socket directory (removed with the agent), one per
// generation and rank; "" without an agent socket.
func (v Vars) ErrorFile() string {
	if v.AgentSocket == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(v.AgentSocket), fmt.Sprintf("error-gen%d-rank%d.json", v.Generation, v.Rank))
}

// TorchrunDefaults are the variables torchrun sets for every worker of a
// node that the agent's environment does not already set: OMP_NUM_THREADS=1
// when the node runs more than one worker and OMP_NUM_THREADS is unset (with
// torchrun's warning, to print once), and TORCHELASTIC_MAX_RESTARTS.
func TorchrunDefaults(getenv func(string) string, nproc, maxRestarts int) (env []string, warning string) {
	env = []string{"TORCHELASTIC_MAX_RESTARTS=" + strconv.Itoa(maxRestarts)}
	if nproc > 1 && getenv("OMP_NUM_THREADS") == "" {
		env = append(env, "OMP_NUM_THREADS=1")
		warning = "*****************************************\n" +
			"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. \n" +
			"*****************************************"
	}
	return env, warning
}

// ErrNotLaunched means the process was not started by `gotrain launch`.
var ErrNotLaunched = errors.New("jobenv: " + Rank + " is not set; start this program with `gotrain launch`")

// FromEnv reads the variables through getenv (os.Getenv in production).
func FromEnv(getenv func(string) string) (Vars, error) {
	if getenv(Rank) == "" {
		return Vars{}, ErrNotLaunched
	}
	var v Vars
	var errs []error
	num := func(name string, dst *int) {
		s := getenv(name)
		n, err := strconv.Atoi(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not an integer", name, s))
			return
		}
		*dst = n
	}
	num(Rank, &v.Rank)
	num(WorldSize, &v.WorldSize)
	num(LocalRank, &v.LocalRank)
	num(LocalWorldSize, &v.LocalWorldSize)
	num(GroupRank, &v.GroupRank)
	num(RestartCount, &v.RestartCount)
	num(GPU, &v.GPU)
	var gen int
	num(Generation, &gen)
	v.Generation = int64(gen)
	v.AgentSocket = getenv(Agent)
	v.JobToken = getenv(JobToken)
	v.RunID = getenv(RunID)
	v.Backend = getenv(Backend)
	v.Host = getenv(Host)
	v.MasterAddr = getenv("MASTER_ADDR")
	if p := getenv("MASTER_PORT"); p != "" {
		num("MASTER_PORT", &v.MasterPort)
	}
	if v.AgentSocket == "" {
		errs = append(errs, fmt.Errorf("%s is empty", Agent))
	}
	if len(errs) == 0 && (v.Rank < 0 || v.Rank >= v.WorldSize) {
		errs = append(errs, fmt.Errorf("rank %d is outside world size %d", v.Rank, v.WorldSize))
	}
	if len(errs) > 0 {
		return Vars{}, fmt.Errorf("jobenv: bad environment from the agent: %w", errors.Join(errs...))
	}
	return v, nil
}

// Strip removes from env every variable this package sets, so that a worker's
// environment never inherits stale values from an enclosing job.
func Strip(env []string) []string {
	set := map[string]bool{}
	for _, kv := range (Vars{}).Environ() {
		set[kv[:strings.IndexByte(kv, '=')]] = true
	}
	set[Standby], set[StandbySlot] = true, true // standby.go
	set[torchhook.EnvDir] = true
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !set[name] {
			out = append(out, kv)
		}
	}
	return out
}
