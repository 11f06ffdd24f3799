//go:build cuda

package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker"
)

// tracePoint is a place in Step where --trace records an event on the
// compute stream.
type tracePoint int

const (
	tpStart    tracePoint = iota // before forward
	tpForward                    // after the last forward GEMM and bias
	tpSoftmax                    // after softmax cross-entropy
	tpBiasGrad                   // layer l: after its bias gradient
	tpDW                         // layer l: after the dW GEMM of chunk k
	tpDX                         // layer l: after the dX GEMM and ReLU backward
	tpBackward                   // end of backward, before DataParallel's Finish
	tpFinish                     // after Finish: every reduction and update is behind it
	tpComm                       // on the communication stream, in afterReduce
)

// traceMark is one event of a traced step and what it marks.
type traceMark struct {
	ev    cudadrv.Event
	p     tracePoint
	what  string
	bytes int // comm stream: the bucket's gradient bytes
}

// tracedStep holds the events of one step, created up front; the first n
// of compute and comm are recorded.
type tracedStep struct {
	compute, comm   []traceMark
	nCompute, nComm int
}

// stepTracer records CUDA events (with timing) through traced steps: on
// the compute stream from the model's thread, and on the communication
// stream from afterReduce, which runs on the communicator's thread while
// the model's thread waits in DataParallel (ncclcomm.Comm.Do returns when
// it has run), so the two never touch the tracer at once. Recording
// allocates nothing.
type stepTracer struct {
	cfg    traceConfig
	stream cudadrv.Stream // the compute stream
	calls  int            // Step calls so far
	steps  []tracedStep
	cur    *tracedStep // the step being recorded; nil outside traced steps
	err    error       // the first failed record

	label      [tpComm][]string // per layer for tpBiasGrad and tpDX, else one
	dwLabel    [][]string       // per layer and chunk
	bucket     map[int]int      // bucket offset → index
	bucketWhat [][2]string      // per bucket: reduced, updated
	bucketLen  []int
}

func newStepTracer(cfg traceConfig, a arch, buckets []worker.Bucket, stream cudadrv.Stream) (*stepTracer, error) {
	t := &stepTracer{cfg: cfg, stream: stream, bucket: map[int]int{}, label: [tpComm][]string{
		tpStart: {"start"}, tpForward: {"fwd"}, tpSoftmax: {"softmax"}, tpBackward: {"bwd.end"}, tpFinish: {"finish"},
	}}
	perStep := 5
	for l := range a.layers() {
		t.label[tpBiasGrad] = append(t.label[tpBiasGrad], fmt.Sprintf("bwd.l%d.bias", l))
		t.label[tpDX] = append(t.label[tpDX], fmt.Sprintf("bwd.l%d.dX", l))
		var dw []string
		for k := range a.chunks(l) {
			if a.chunks(l) == 1 {
				dw = append(dw, fmt.Sprintf("bwd.l%d.dW", l))
			} else {
				dw = append(dw, fmt.Sprintf("bwd.l%d.dW.k%d", l, k))
			}
		}
		t.dwLabel = append(t.dwLabel, dw)
		perStep += 2 + a.chunks(l)
	}
	for i, b := range buckets {
		t.bucket[b.Offset] = i
		t.bucketWhat = append(t.bucketWhat, [2]string{fmt.Sprintf("comm.b%d.reduced", i), fmt.Sprintf("comm.b%d.updated", i)})
		t.bucketLen = append(t.bucketLen, b.Len)
	}
	t.steps = make([]tracedStep, cfg.Steps)
	for i := range t.steps {
		st := &t.steps[i]
		st.compute, st.comm = make([]traceMark, perStep), make([]traceMark, 2*len(buckets))
		for _, marks := range [][]traceMark{st.compute, st.comm} {
			for j := range marks {
				ev, err := cudadrv.NewEvent(cudadrv.EventDefault)
				if err != nil {
					t.close()
					return nil, fmt.Errorf("trace: %w", err)
				}
				marks[j].ev = ev
			}
		}
	}
	return t, nil
}

// mark records point p (of layer l, chunk k) on the compute stream when
// the step is traced; with t nil (no --trace) it is a nil check.
func (t *stepTracer) mark(p tracePoint, l, k int) {
	if t != nil {
		t.record(p, l, k)
	}
}

func (t *stepTracer) record(p tracePoint, l, k int) {
	if p == tpStart {
		t.calls++
		t.cur = nil
		if i := t.calls - 1 - t.cfg.Skip; i >= 0 && i < len(t.steps) {
			t.cur = &t.steps[i]
			t.cur.nCompute, t.cur.nComm = 0, 0
		}
	}
	st := t.cur
	if st == nil {
		return
	}
	var what string
	switch p {
	case tpBiasGrad, tpDX:
		what = t.label[p][l]
	case tpDW:
		what = t.dwLabel[l][k]
	default:
		what = t.label[p][0]
	}
	if st.nCompute == len(st.compute) {
		t.fail(errors.New("more compute-stream marks than planned"))
		return
	}
	m := &st.compute[st.nCompute]
	m.p, m.what = p, what
	if err := m.ev.Record(t.stream); err != nil {
		t.fail(err)
		return
	}
	st.nCompute++
	if p == tpFinish {
		t.cur = nil
	}
}

// markBucket records on stream s, in afterReduce (DataParallel's update
// stream, or the communication stream with GOTRAIN_DP_TUNING=serial-update), that bucket b's
// all-reduce is done (before its update is enqueued) or that its update is
// (updated). With DeferUpdate, "reduced" also waits for backward's release
// of the bucket.
func (t *stepTracer) markBucket(b worker.Bucket, s uintptr, updated bool) {
	if t == nil || t.cur == nil {
		return
	}
	st := t.cur
	i, ok := t.bucket[b.Offset]
	if !ok || st.nComm == len(st.comm) {
		t.fail(fmt.Errorf("unplanned communication-stream mark (bucket at %d)", b.Offset))
		return
	}
	m := &st.comm[st.nComm]
	j := 0
	if updated {
		j = 1
	}
	m.p, m.what, m.bytes = tpComm, t.bucketWhat[i][j], 4*t.bucketLen[i]
	if err := m.ev.Record(cudadrv.Stream(s)); err != nil {
		t.fail(err)
		return
	}
	st.nComm++
}

func (t *stepTracer) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// WriteTrace prints each traced step's events in time order, in µs since
// the step's start, then the averages; call it after the final Sync.
//
//	trace rank=R step=K at_us=T what=LABEL [bytes=N]
//	trace_summary rank=R steps=N fwd_us=… bwd_us=… tail_us=… step_us=…
func (m *gpuModel) WriteTrace(w io.Writer, rank int) error {
	t := m.tr
	if t == nil {
		return nil
	}
	if t.err != nil {
		return fmt.Errorf("trace: %w", t.err)
	}
	us := func(from, to cudadrv.Event) (float64, error) {
		d, err := cudadrv.Elapsed(from, to)
		return float64(d) / float64(time.Microsecond), err
	}
	var fwd, bwd, tail, step float64
	n := 0
	for i := range t.steps {
		st := &t.steps[i]
		if st.nCompute == 0 || st.compute[st.nCompute-1].p != tpFinish {
			continue // not run
		}
		type row struct {
			at float64
			m  *traceMark
		}
		rows := make([]row, 0, st.nCompute+st.nComm)
		at := map[tracePoint]float64{}
		start := st.compute[0].ev
		for _, marks := range [][]traceMark{st.compute[:st.nCompute], st.comm[:st.nComm]} {
			for j := range marks {
				v, err := us(start, marks[j].ev)
				if err != nil {
					return fmt.Errorf("trace: %w", err)
				}
				rows = append(rows, row{v, &marks[j]})
				at[marks[j].p] = v // the single compute-stream points are the ones used
			}
		}
		slices.SortStableFunc(rows, func(a, b row) int {
			switch {
			case a.at < b.at:
				return -1
			case a.at > b.at:
				return 1
			}
			return 0
		})
		for _, r := range rows {
			fmt.Fprintf(w, "trace rank=%d step=%d at_us=%.1f what=%s", rank, t.cfg.First+i, r.at, r.m.what)
			if r.m.bytes > 0 {
				fmt.Fprintf(w, " bytes=%d", r.m.bytes)
			}
			fmt.Fprintln(w)
		}
		dt := at[tpFinish]
		if i+1 < len(t.steps) && t.steps[i+1].nCompute > 0 {
			v, err := us(start, t.steps[i+1].compute[0].ev)
			if err != nil {
				return fmt.Errorf("trace: %w", err)
			}
			dt = v
		}
		fwd += at[tpForward]
		bwd += at[tpBackward] - at[tpSoftmax]
		tail += at[tpFinish] - at[tpBackward]
		step += dt
		n++
	}
	if n == 0 {
		return errors.New("trace: no traced step ran")
	}
	k := float64(n)
	_, err := fmt.Fprintf(w, "trace_summary rank=%d steps=%d fwd_us=%.1f bwd_us=%.1f tail_us=%.1f step_us=%.1f\n",
		rank, n, fwd/k, bwd/k, tail/k, step/k)
	return err
}

// close destroys the events (nil-safe).
func (t *stepTracer) close() {
	if t == nil {
		return
	}
	for i := range t.steps {
		for _, marks := range [][]traceMark{t.steps[i].compute, t.steps[i].comm} {
			for _, m := range marks {
				if m.ev != 0 {
					m.ev.Destroy()
				}
			}
		}
	}
	t.steps = nil
}
