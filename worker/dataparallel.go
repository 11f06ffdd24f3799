package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"

	"github.com/gotrain/gotrain/worker/flight"
)

// DefaultBucketBytes is the gradient bucket size DataParallel uses when the
// config leaves it zero: 25 MiB, as PyTorch DDP.
const DefaultBucketBytes = 25 << 20

// DataParallelConfig configures a DataParallel. The zero value is complete:
// 25 MiB buckets, no accumulation, fp32 reduction.
type DataParallelConfig struct {
	// BucketBytes is the size a bucket of gradients grows to before it is
	// closed (a parameter never spans two buckets, so a bucket can be larger
	// when one parameter is). 0 means DefaultBucketBytes.
	BucketBytes int
	// AccumulationSteps is k: gradients of k micro-steps are summed locally
	// and reduced once, on the last; the result is the mean over k × ranks
	// micro-batches. 0 means 1.
	AccumulationSteps int
	// BF16 reduces float32 gradients as bfloat16 (half the bytes): each rank
	// rounds its gradients to bfloat16 (nearest even), the ranks sum them in
	// bfloat16, and the sum, scaled to the mean, is written back as float32.
	BF16 bool
	// Stream is the CUDA stream (a CUstream) that writes the gradients of
	// device buffers; reductions start after the work enqueued on it before
	// Ready, and the work enqueued on it after Finish waits for them.
	// Ignored for host buffers.
	Stream uintptr
	// Kernels does the element-wise work on device buffers that NCCL does
	// not: needed on a GPU for BF16 and for AccumulationSteps > 1.
	Kernels DeviceKernels
	// AfterReduce, when set, runs for each bucket on a syncing micro-step as
	// soon as its averaged gradients are ready: the place for the optimizer
	// step of the bucket's parameters, which then overlaps the rest of
	// backward (backward must not read a parameter after marking it Ready).
	// On the host it runs on DataParallel's goroutine; on a GPU it runs on
	// the communicator's thread and must only enqueue work on stream (a
	// stream of DataParallel's that waits for the bucket's reduction; the
	// communication stream with TuningEnv's serial-update), which the
	// compute stream waits for at Finish.
	AfterReduce func(b Bucket, stream uintptr) error
	// DeferUpdate holds a bucket's AfterReduce until backward has also
	// Released every parameter of the bucket (Finish releases the rest):
	// backward may then read a parameter after marking its gradient Ready.
	// A layer can so compute its weight gradient before the input gradient
	// that reads the weight, and the weight's reduction starts one GEMM
	// earlier. On a GPU, a bucket released after its launch has its
	// AfterReduce wait for one more event, recorded on Stream at the release.
	DeferUpdate bool
	// Transport is how device buffers travel between ranks: TransportAuto
	// (the zero value) uses the copy engines for two ranks on one node that
	// can map each other's memory and NCCL otherwise; see Transport.
	Transport Transport
	// FusedSum, with the copy-engine transport, leaves the addition of the
	// peer's gradients to AfterReduce (see Bucket.Peer), which reads both
	// anyway: one pass over the gradients less per step, and the last
	// bucket's update starts as soon as the peer's copy is in. The
	// gradient buffer then never holds the average. Needs AfterReduce;
	// without the copy-engine transport it changes nothing.
	FusedSum bool
	Logger   *slog.Logger // may be nil (then discard)
}

// Transport chooses how DataParallel moves device gradients.
type Transport int

const (
	// TransportAuto: TransportCopyEngine where it works (two ranks of one
	// node, or more ranks of one node of which some share a GPU; fp32
	// reduction), else TransportNCCL.
	TransportAuto Transport = iota
	// TransportNCCL: NCCL's all-reduce (its kernels, on SMs).
	TransportNCCL
	// TransportCopyEngine: for two ranks of one node, each copies its
	// gradients into the other GPU's memory with a copy engine and a small
	// kernel adds them (package pairreduce): SMs only for the addition. For
	// more ranks of one node, a reduce-scatter and all-gather of chunks
	// over the copy engines, each rank adding its own chunk (package
	// nodereduce); FusedSum then does not apply.
	// NewDataParallel and Close are then collective. An error when the two
	// ranks cannot map each other's memory, or with BF16.
	TransportCopyEngine
)

var transportNames = [...]string{TransportAuto: "auto", TransportNCCL: "nccl", TransportCopyEngine: "copy-engine"}

func (t Transport) String() string {
	if int(t) < len(transportNames) {
		return transportNames[t]
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// ParseTransport parses "auto", "nccl" or "copy-engine".
func ParseTransport(s string) (Transport, error) {
	for t, name := range transportNames {
		if s == name {
			return Transport(t), nil
		}
	}
	return 0, fmt.Errorf("unknown transport %q: want auto, nccl or copy-engine", s)
}

// DeviceKernels is the element-wise GPU work DataParallel needs beyond NCCL,
// supplied by the training program, which has its own kernels (see
// examples/mlp). Each call enqueues on stream and does not wait. Pointers
// are CUdeviceptrs.
type DeviceKernels interface {
	// ToBF16 writes the n float32 at src as bfloat16 (round to nearest even) to dst.
	ToBF16(dst, src uintptr, n int, stream uintptr) error
	// FromBF16 writes scale × the n bfloat16 at src as float32 to dst.
	FromBF16(dst, src uintptr, n int, scale float32, stream uintptr) error
	// Scale multiplies the n float32 at p by s.
	Scale(p uintptr, n int, s float32, stream uintptr) error
}

func (cfg *DataParallelConfig) validate(deviceGrads bool) error {
	if cfg.BucketBytes == 0 {
		cfg.BucketBytes = DefaultBucketBytes
	}
	if cfg.AccumulationSteps == 0 {
		cfg.AccumulationSteps = 1
	}
	switch {
	case cfg.BucketBytes < 0:
		return fmt.Errorf("worker: DataParallel: bucket size %d bytes, want more than 0", cfg.BucketBytes)
	case cfg.AccumulationSteps < 0:
		return fmt.Errorf("worker: DataParallel: %d accumulation steps, want 1 or more", cfg.AccumulationSteps)
	case cfg.Transport < TransportAuto || cfg.Transport > TransportCopyEngine:
		return fmt.Errorf("worker: DataParallel: unknown %v", cfg.Transport)
	case cfg.FusedSum && cfg.AfterReduce == nil:
		return errors.New("worker: DataParallel: FusedSum needs an AfterReduce that adds Bucket.Peer")
	case cfg.Transport == TransportCopyEngine && !deviceGrads:
		return errors.New("worker: DataParallel: the copy-engine transport moves gradients in device memory; these are in host memory (use the default transport)")
	case cfg.Transport == TransportCopyEngine && cfg.BF16:
		return errors.New("worker: DataParallel: the copy-engine transport moves float32 gradients; drop BF16 or use the NCCL transport")
	}
	return nil
}

// Bucket is a contiguous range of the gradient buffer that is reduced in one
// collective: the gradients of parameters First down to Last (Last ≤ First:
// backward produces them in that order).
type Bucket struct {
	First, Last int // parameter indices
	Offset, Len int // elements of the gradient buffer
	// Peer, when not 0, is a device pointer to the peer's gradients of the
	// bucket (Len float32) that have not been added: the averaged gradient
	// is then (own + peer) × Scale, computed as __fmul_rn(__fadd_rn(own,
	// peer), Scale) to keep every rank bitwise equal. AfterReduce sees it
	// only with DataParallelConfig.FusedSum; it must not keep the pointer.
	Peer  uintptr
	Scale float32
}

// DataParallel averages gradients over the ranks of a communicator while
// backward runs. See the package documentation, section "Data parallel".
type DataParallel struct {
	c      Comm
	cfg    DataParallelConfig
	log    *slog.Logger
	grads  Buffer
	sizes  []int
	offset []int // per parameter, elements into grads
	bucket []int // per parameter, its bucket
	bkts   []Bucket

	micro   int    // micro-step within the accumulation window, 0..k-1
	ready   []bool // per parameter, in this micro-step
	pending []int  // per bucket, parameters not yet ready
	nReady  int
	started int // buckets launched in this micro-step

	// DeferUpdate: per parameter released, per bucket parameters not yet
	// released and whether its AfterReduce has been issued.
	released   []bool
	unreleased []int
	updated    []bool

	tune tuning // TuningEnv's knobs

	eng engine
}

// engine carries out the reductions of one backend.
type engine interface {
	// launch starts the reduction of bucket b (in order of launch), then
	// its AfterReduce when update is set.
	launch(ctx context.Context, b int, update bool) error
	// update runs (host) or enqueues (device) bucket b's AfterReduce after
	// its launched reduction and after the caller's work so far.
	update(ctx context.Context, b int) error
	// finish waits for (host) or orders the stream after (device) every
	// launched reduction.
	finish(ctx context.Context) error
	broadcast(ctx context.Context, params Buffer) error
	close() error
}

// NewDataParallel prepares data-parallel training over c for parameters of
// the given sizes (elements, in the order of the forward pass) whose
// gradients live in grads, one float32 buffer of sum(sizes) elements in host
// or device memory. DataParallel lays the gradients out in reverse order
// (the last parameter first) so that every bucket is a contiguous range:
// find parameter i's gradient with Grad(i) or Offset(i). A parameter buffer
// laid out the same way lets the optimizer run on whole buckets.
//
// Device buffers need the NCCL backend and cfg.Stream. With the copy-engine
// transport NewDataParallel is collective (the ranks exchange their memory
// handles): ctx bounds that exchange.
func NewDataParallel(ctx context.Context, c Comm, sizes []int, grads Buffer, cfg DataParallelConfig) (*DataParallel, error) {
	if err := cfg.validate(grads.OnDevice()); err != nil {
		return nil, err
	}
	tune, err := parseTuning(os.Getenv(TuningEnv))
	if err != nil {
		return nil, err
	}
	if grads.DType() != Float32 {
		return nil, fmt.Errorf("worker: DataParallel: gradients are %s, want float32", grads.DType())
	}
	total := 0
	for i, n := range sizes {
		if n <= 0 {
			return nil, fmt.Errorf("worker: DataParallel: parameter %d has %d elements, want more than 0", i, n)
		}
		total += n
	}
	if total != grads.Len() {
		return nil, fmt.Errorf("worker: DataParallel: the parameters have %d elements but the gradient buffer %d", total, grads.Len())
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if tune != (tuning{}) {
		log.Warn("DataParallel runs with benchmark knobs", "rank", c.Rank(), "env", TuningEnv, "knobs", tune.String())
	}
	dp := &DataParallel{
		c: c, cfg: cfg, tune: tune, log: log, grads: grads, sizes: append([]int(nil), sizes...),
		offset: make([]int, len(sizes)), bucket: make([]int, len(sizes)), ready: make([]bool, len(sizes)),
		released: make([]bool, len(sizes)),
	}
	limit := max(cfg.BucketBytes/4, 1)
	off := 0
	for i := len(sizes) - 1; i >= 0; i-- {
		dp.offset[i] = off
		nb := len(dp.bkts)
		if nb == 0 || dp.bkts[nb-1].Len >= limit {
			dp.bkts = append(dp.bkts, Bucket{First: i, Last: i, Offset: off})
			nb++
		}
		b := &dp.bkts[nb-1]
		b.Last = i
		b.Len += sizes[i]
		dp.bucket[i] = nb - 1
		off += sizes[i]
	}
	dp.pending = make([]int, len(dp.bkts))
	dp.unreleased, dp.updated = make([]int, len(dp.bkts)), make([]bool, len(dp.bkts))
	dp.resetMicro()

	if grads.OnDevice() {
		dp.eng, err = newDeviceEngine(ctx, dp)
	} else {
		dp.eng = newHostEngine(dp)
	}
	if err != nil {
		return nil, err
	}
	log.Debug("data parallel", "params", len(sizes), "elements", total, "buckets", len(dp.bkts),
		"bucket_bytes", cfg.BucketBytes, "accumulation", cfg.AccumulationSteps, "bf16", cfg.BF16, "device", grads.OnDevice())
	return dp, nil
}

func (dp *DataParallel) resetMicro() {
	for i := range dp.ready {
		dp.ready[i], dp.released[i] = false, false
	}
	for b := range dp.bkts {
		dp.pending[b] = dp.bkts[b].First - dp.bkts[b].Last + 1
		dp.unreleased[b], dp.updated[b] = dp.pending[b], false
	}
	dp.nReady, dp.started = 0, 0
}

// Transport returns how gradients in device memory travel: TransportCopyEngine
// or TransportNCCL, as chosen at NewDataParallel; TransportAuto for host
// buffers (the communicator's own collectives).
func (dp *DataParallel) Transport() Transport {
	e, ok := dp.eng.(*deviceEngine)
	switch {
	case !ok:
		return TransportAuto
	case e.ce != nil:
		return TransportCopyEngine
	default:
		return TransportNCCL
	}
}

// Buckets returns the buckets, in the order they are reduced.
func (dp *DataParallel) Buckets() []Bucket { return append([]Bucket(nil), dp.bkts...) }

// Offset returns where parameter i's gradient starts in the gradient
// buffer, in elements.
func (dp *DataParallel) Offset(i int) int { return dp.offset[i] }

// Grad returns parameter i's gradient: its range of the gradient buffer.
func (dp *DataParallel) Grad(i int) Buffer {
	return dp.grads.Slice(dp.offset[i], dp.offset[i]+dp.sizes[i])
}

// MicroStep returns the micro-step within the accumulation window, 0 to
// AccumulationSteps-1. Backward overwrites the gradients on micro-step 0 and
// adds to them on the others.
func (dp *DataParallel) MicroStep() int { return dp.micro }

// Syncing reports whether this micro-step's backward reduces the gradients
// (the last micro-step of the window): after its Finish, step the optimizer.
func (dp *DataParallel) Syncing() bool { return dp.micro == dp.cfg.AccumulationSteps-1 }

// BroadcastParams copies rank 0's parameters (a buffer laid out like the
// gradients, or any float32 buffer on the same side) to every rank, so
// that all ranks start from the same weights. On a GPU it first waits for
// the work on cfg.Stream.
func (dp *DataParallel) BroadcastParams(ctx context.Context, params Buffer) error {
	if params.OnDevice() != dp.grads.OnDevice() {
		return errors.New("worker: DataParallel: the parameters and the gradients must both be in host or both in device memory")
	}
	if err := dp.eng.broadcast(ctx, params); err != nil {
		return fmt.Errorf("worker: DataParallel: broadcast the parameters: %w", err)
	}
	return nil
}

// Ready says that backward has produced parameter i's gradient (on a GPU:
// enqueued the work that writes it on cfg.Stream). When every gradient of a
// bucket is ready on a syncing micro-step, its reduction starts at once,
// overlapping the rest of backward. Call it in any order, once per
// parameter per micro-step; buckets are reduced in a fixed order (every rank
// must issue the same collectives), so a bucket waits for the ones before it.
func (dp *DataParallel) Ready(ctx context.Context, i int) error {
	if i < 0 || i >= len(dp.sizes) {
		return fmt.Errorf("worker: DataParallel: Ready(%d) of %d parameters", i, len(dp.sizes))
	}
	if dp.ready[i] {
		return fmt.Errorf("worker: DataParallel: parameter %d is ready twice in one micro-step", i)
	}
	dp.ready[i] = true
	dp.nReady++
	dp.pending[dp.bucket[i]]--
	if !dp.Syncing() {
		return nil
	}
	for dp.started < len(dp.bkts) && dp.pending[dp.started] == 0 {
		b := dp.started
		// Without DeferUpdate, or when every parameter of the bucket was
		// released before it was ready, the update follows the reduction.
		update := dp.cfg.AfterReduce != nil && (!dp.cfg.DeferUpdate || dp.unreleased[b] == 0)
		if err := dp.eng.launch(ctx, b, update); err != nil {
			return fmt.Errorf("worker: DataParallel: reduce bucket %d: %w", b, err)
		}
		dp.updated[b] = update
		dp.started++
	}
	return nil
}

// Release says, with DeferUpdate, that backward no longer reads parameter i
// in this micro-step (on a GPU: has enqueued its last read on cfg.Stream),
// so that the AfterReduce of its bucket (the optimizer) may overwrite it.
// Call it in any order, before or after Ready, at most once per parameter
// per micro-step; Finish releases the parameters not released. Without
// DeferUpdate, Release does nothing.
func (dp *DataParallel) Release(ctx context.Context, i int) error {
	if i < 0 || i >= len(dp.sizes) {
		return fmt.Errorf("worker: DataParallel: Release(%d) of %d parameters", i, len(dp.sizes))
	}
	if !dp.cfg.DeferUpdate {
		return nil
	}
	if dp.released[i] {
		return fmt.Errorf("worker: DataParallel: parameter %d is released twice in one micro-step", i)
	}
	dp.released[i] = true
	b := dp.bucket[i]
	dp.unreleased[b]--
	if dp.unreleased[b] > 0 || b >= dp.started || dp.updated[b] || !dp.Syncing() {
		return nil
	}
	return dp.updateBucket(ctx, b)
}

func (dp *DataParallel) updateBucket(ctx context.Context, b int) error {
	if dp.cfg.AfterReduce == nil {
		return nil
	}
	if err := dp.eng.update(ctx, b); err != nil {
		return fmt.Errorf("worker: DataParallel: update bucket %d: %w", b, err)
	}
	dp.updated[b] = true
	return nil
}

// ReadyAll marks every parameter not yet ready as ready.
func (dp *DataParallel) ReadyAll(ctx context.Context) error {
	for i := len(dp.sizes) - 1; i >= 0; i-- {
		if !dp.ready[i] {
			if err := dp.Ready(ctx, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// Finish ends a micro-step's backward; every parameter must have been
// marked ready. On a syncing micro-step it returns true once the averaged
// gradients are in the gradient buffer: on the host when the reductions are
// done, on a GPU as soon as the work enqueued on cfg.Stream from now on
// waits for them (the host does not wait).
func (dp *DataParallel) Finish(ctx context.Context) (synced bool, err error) {
	if dp.nReady != len(dp.sizes) {
		return false, fmt.Errorf("worker: DataParallel: Finish with %d of %d parameters ready", dp.nReady, len(dp.sizes))
	}
	synced = dp.Syncing()
	if synced {
		for b := range dp.bkts {
			if !dp.updated[b] {
				if err := dp.updateBucket(ctx, b); err != nil {
					return false, err
				}
			}
		}
		if err := dp.eng.finish(ctx); err != nil {
			return false, fmt.Errorf("worker: DataParallel: %w", err)
		}
	}
	dp.micro = (dp.micro + 1) % dp.cfg.AccumulationSteps
	dp.resetMicro()
	return synced, nil
}

// Close releases what DataParallel allocated (events, staging memory). It
// does not close the communicator.
func (dp *DataParallel) Close() error { return dp.eng.close() }

// meanScale turns the sum over the ranks of k micro-steps' gradients into
// their mean: 1/(ranks × k).
func (dp *DataParallel) meanScale() float32 {
	return float32(1 / float64(dp.c.Size()*dp.cfg.AccumulationSteps))
}

// scale returns the factor that turns a reduced sum or average into the
// mean over k × ranks micro-batches: 1/k after Avg.
func (dp *DataParallel) postScale() float32 {
	return float32(1 / float64(dp.cfg.AccumulationSteps))
}

// recorderOf returns the flight recorder c records into, nil if none.
func recorderOf(c Comm) *flight.Recorder {
	if w, ok := c.(*flight.Comm); ok {
		return w.Recorder()
	}
	return nil
}

// unwrap returns the backend under the flight recorder's wrapper.
func unwrap(c Comm) Comm {
	for {
		w, ok := c.(*flight.Comm)
		if !ok {
			return c
		}
		c = w.Unwrap()
	}
}

// hostEngine reduces host buffers on one goroutine, in launch order, so that
// the caller's backward goes on meanwhile.
type hostEngine struct {
	dp   *DataParallel
	mu   sync.Mutex
	work chan hostJob
	wg   sync.WaitGroup
	err  error // first error since the last finish
}

type hostJob struct {
	ctx            context.Context
	b              int
	reduce, update bool
}

func newHostEngine(dp *DataParallel) *hostEngine {
	// Per bucket at most one reduction and one deferred update.
	e := &hostEngine{dp: dp, work: make(chan hostJob, 2*len(dp.bkts))}
	go e.loop()
	return e
}

func (e *hostEngine) loop() {
	for j := range e.work {
		e.mu.Lock()
		failed := e.err != nil
		e.mu.Unlock()
		if !failed {
			if err := e.run(j); err != nil {
				e.mu.Lock()
				e.err = fmt.Errorf("bucket %d: %w", j.b, err)
				e.mu.Unlock()
			}
		}
		e.wg.Done()
	}
}

func (e *hostEngine) run(j hostJob) error {
	dp := e.dp
	bk := dp.bkts[j.b]
	if j.reduce {
		buf := dp.grads.Slice(bk.Offset, bk.Offset+bk.Len)
		if err := e.reduceOnly(j.ctx, buf, buf.Float32s()); err != nil {
			return fmt.Errorf("reduce: %w", err)
		}
	}
	if j.update && dp.cfg.AfterReduce != nil {
		return dp.cfg.AfterReduce(bk, 0)
	}
	return nil
}

func (e *hostEngine) reduceOnly(ctx context.Context, buf Buffer, g []float32) error {
	dp := e.dp
	if dp.c.Size() == 1 && !dp.cfg.BF16 {
		if dp.cfg.AccumulationSteps > 1 {
			s := dp.postScale()
			for i := range g {
				g[i] *= s
			}
		}
		return nil
	}
	if !dp.cfg.BF16 {
		if err := dp.c.AllReduce(ctx, buf, buf, Avg); err != nil {
			return err
		}
		if dp.cfg.AccumulationSteps > 1 {
			s := dp.postScale()
			for i := range g {
				g[i] *= s
			}
		}
		return nil
	}
	// bfloat16 on the wire: round, sum, round the sum, scale to the mean.
	for i, v := range g {
		g[i] = RoundBF16(v)
	}
	if err := dp.c.AllReduce(ctx, buf, buf, Sum); err != nil {
		return err
	}
	s := dp.meanScale()
	for i, v := range g {
		g[i] = RoundBF16(v) * s
	}
	return nil
}

func (e *hostEngine) launch(ctx context.Context, b int, update bool) error {
	e.wg.Add(1)
	e.work <- hostJob{ctx: ctx, b: b, reduce: true, update: update}
	return nil
}

func (e *hostEngine) update(ctx context.Context, b int) error {
	e.wg.Add(1)
	e.work <- hostJob{ctx: ctx, b: b, update: true}
	return nil
}

func (e *hostEngine) finish(ctx context.Context) error {
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.err
	e.err = nil
	return err
}

func (e *hostEngine) broadcast(ctx context.Context, params Buffer) error {
	return e.dp.c.Broadcast(ctx, params, 0)
}

func (e *hostEngine) close() error {
	e.wg.Wait()
	close(e.work)
	return nil
}

// RoundBF16 returns v rounded to the nearest bfloat16 (ties to even), as a
// float32: what a bfloat16 reduction keeps of a float32 gradient. NaN stays
// NaN; values beyond bfloat16's range become ±Inf.
func RoundBF16(v float32) float32 {
	return math.Float32frombits(uint32(BF16Bits(v)) << 16)
}

// BF16Bits returns the bfloat16 encoding of v rounded to nearest even.
func BF16Bits(v float32) uint16 {
	b := math.Float32bits(v)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet NaN
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
