package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobenv"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// The data-plane names, re-exported from package comm so that training code
// imports only worker.
type (
	Comm    = comm.Comm
	Buffer  = comm.Buffer
	DType   = comm.DType
	Op      = comm.Op
	Element = comm.Element
)

const (
	Float32 = comm.Float32
	Float64 = comm.Float64
	Int32   = comm.Int32
	Int64   = comm.Int64

	Sum = comm.Sum
	Avg = comm.Avg
	Max = comm.Max
	Min = comm.Min
)

// Host returns a Buffer over a Go slice.
func Host[T Element](s []T) Buffer { return comm.Host(s) }

// Worker is this process's place in the job.
type Worker struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	// GroupRank is the rank of this worker's node.
	GroupRank int
	// Generation counts the job's (re)starts; rendezvous keys include it.
	Generation   int64
	RestartCount int
	// Backend is "cpu" or "nccl", as `gotrain launch --backend` chose.
	Backend string
	// GPU is the index of this worker's GPU on its node, -1 for none.
	GPU int

	vars   jobenv.Vars
	conn   *grpc.ClientConn
	agent  gotrainv1.AgentClient
	logger *slog.Logger
	diag   *attachment // the control stream (attach.go)
	recov  recovery    // generation changes for Run (recover.go)

	noPrewarm bool          // WithoutPrewarm
	recovered RecoveryTimes // of the last in-process recovery (recover.go)
}

// ErrNotLaunched means the program was started without `gotrain launch`.
var ErrNotLaunched = jobenv.ErrNotLaunched

// Option changes how Init sets the worker up.
type Option func(*Worker)

// WithLogger gives the worker a logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(w *Worker) { w.logger = l } }

// WithoutPrewarm keeps Init from loading the CUDA driver, the GPU's primary
// context and NCCL in the background (ncclcomm.Prewarm) on the NCCL backend;
// NewComm then loads them itself. The prewarm holds the primary context for
// the life of the process.
func WithoutPrewarm() Option { return func(w *Worker) { w.noPrewarm = true } }

// Init reads the environment that `gotrain launch` set and connects to this
// node's agent. In a hot standby (gotrain launch --standby) it first waits,
// prewarmed, until the agent assigns the process a rank (standby.go); ctx
// bounds that wait.
func Init(ctx context.Context, opts ...Option) (*Worker, error) {
	conn, err := awaitAssignment(ctx, opts) // nil unless this process is a standby
	if err != nil {
		return nil, err
	}
	vars, err := jobenv.FromEnv(os.Getenv)
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{logger: slog.New(slog.DiscardHandler)}
	w.setVars(vars) // identity.go
	for _, o := range opts {
		o(w)
	}
	w.logger = w.logger.With("rank", w.Rank)
	if w.Backend == "nccl" && !w.noPrewarm {
		// The CUDA driver, the GPU's primary context and NCCL load in the
		// background while the program starts up; NewComm waits for them.
		if dev, err := rankDevice(w.LocalRank, w.GPU, os.Getenv, func(string) {}); err == nil { // NewComm says why not
			ncclcomm.Prewarm(dev)
		}
	}
	if conn == nil {
		conn, err = dialAgent(vars.AgentSocket, vars.JobToken)
		if err != nil {
			return nil, fmt.Errorf("worker: rank %d: connect to agent at %s: %w", w.Rank, vars.AgentSocket, err)
		}
	}
	w.conn = conn
	w.agent = gotrainv1.NewAgentClient(conn)
	w.diag = w.attach() // attach.go: progress reports, stack dumps
	return w, nil
}

// Close sends the last progress report and releases the connection to the
// agent.
func (w *Worker) Close() error {
	if w.diag != nil {
		w.diag.close()
	}
	return w.conn.Close()
}

// Store returns the rendezvous key-value store this worker's backends use,
// served by the agent.
func (w *Worker) Store() comm.Store { return agentStore{w.agent} }

// NewComm builds a communicator named name over every rank of the job, with
// the backend `gotrain launch --backend` chose. Every rank must call NewComm
// with the same name; names must be unique within a generation. opts tune
// the communicator (commopts.go).
func (w *Worker) NewComm(ctx context.Context, name string, opts ...CommOption) (Comm, error) {
	co := newCommOptions(opts)
	switch w.Backend {
	case "cpu", "":
		host := w.vars.Host
		if host == "" {
			host = "127.0.0.1"
		}
		c, err := cpucomm.New(ctx, cpucomm.Config{
			Name: name, Generation: w.Generation,
			Rank: w.Rank, Size: w.WorldSize,
			Host: host, Store: w.Store(), Logger: w.logger,
			Token: w.vars.JobToken, // each rank connection proves it
		})
		if err != nil {
			return nil, fmt.Errorf("worker: rank %d: %w", w.Rank, err)
		}
		return w.diag.track(name, c), nil
	case "nccl":
		dev, err := rankDevice(w.LocalRank, w.GPU, os.Getenv, func(msg string) {
			fmt.Fprintf(os.Stderr, "gotrain worker: warning: rank %d: %s\n", w.Rank, msg) // the agent prefixes it [rank N]
		})
		if err != nil {
			return nil, fmt.Errorf("worker: rank %d: %w", w.Rank, err)
		}
		c, err := ncclcomm.New(ctx, ncclcomm.Config{
			Name: name, Generation: w.Generation,
			Rank: w.Rank, Size: w.WorldSize,
			Device: dev,
			Store:  w.Store(), Logger: w.logger, Tuning: co.nccl,
		})
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		return w.diag.track(name, c), nil
	default:
		return nil, fmt.Errorf("worker: rank %d: backend %q is not available in this build (use --backend cpu)", w.Rank, w.Backend)
	}
}

// agentStore is comm.Store over the agent's KV calls.
type agentStore struct{ agent gotrainv1.AgentClient }

// kvPollWait bounds one long-poll; Get re-polls until ctx ends, so a slow
// peer never turns into a failed rendezvous by itself.
const kvPollWait = 10 * time.Second

func (s agentStore) Put(ctx context.Context, key string, value []byte) error {
	_, err := s.agent.KVPut(ctx, &gotrainv1.KVPutRequest{Key: key, Value: value})
	if err != nil {
		return fmt.Errorf("publish %q through the agent: %w", key, err)
	}
	return nil
}

func (s agentStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		resp, err := s.agent.KVGet(ctx, &gotrainv1.KVGetRequest{Key: key, WaitMs: kvPollWait.Milliseconds()})
		switch {
		case err == nil && resp.GetFound():
			return resp.GetValue(), nil
		case err == nil:
			continue
		case errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded):
			return nil, fmt.Errorf("wait for %q: %w", key, ctx.Err())
		case status.Code(err) == codes.Unavailable:
			return nil, fmt.Errorf("wait for %q: the agent is unreachable (did `gotrain launch` exit?): %w", key, err)
		default:
			return nil, fmt.Errorf("wait for %q: %w", key, err)
		}
	}
}
