package main

import (
	"context"
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	"github.com/gotrain/gotrain/worker"
)

// cpuModel is the network on the CPU with gonum's BLAS. It is the reference
// the GPU model is tested against, and trains MNIST on CPU ranks.
type cpuModel struct {
	cfg    modelConfig
	a      arch
	dp     *worker.DataParallel
	params []float32
	grads  []float32
	state1 []float32 // momentum or Adam's first moment
	state2 []float32 // Adam's second moment
	t      int       // optimizer steps taken

	acts   [][]float32 // acts[l]: rows × dims[l]; acts[0] the input
	labels []int32
	rows   int
	dA, dB []float32 // gradient ping-pong, rows × maxDim
	loss   float32
}

func newCPUModel(ctx context.Context, c worker.Comm, cfg modelConfig) (*cpuModel, error) {
	a := cfg.Arch.withChunks(cfg.ChunkBytes, cfg.FirstChunk)
	n := a.numParams()
	m := &cpuModel{cfg: cfg, a: a, params: make([]float32, n), grads: make([]float32, n)}
	dpc := cfg.DP
	dpc.AfterReduce = m.afterReduce
	var err error
	if m.dp, err = worker.NewDataParallel(ctx, c, a.sizes(), worker.Host(m.grads), dpc); err != nil {
		return nil, err
	}
	initParams(a, m.params, m.dp.Offset, cfg.Seed)
	if !cfg.NoBcast {
		if err := m.dp.BroadcastParams(ctx, worker.Host(m.params)); err != nil {
			return nil, err
		}
	}
	switch cfg.Optim.Kind {
	case "momentum":
		m.state1 = make([]float32, n)
	case "adam":
		m.state1, m.state2 = make([]float32, n), make([]float32, n)
	}
	m.alloc(cfg.Batch)
	return m, nil
}

func (m *cpuModel) alloc(rows int) {
	if rows <= m.rows && m.acts != nil {
		m.rows = rows
		return
	}
	m.acts = make([][]float32, len(m.a.dims))
	for l, d := range m.a.dims {
		m.acts[l] = make([]float32, rows*d)
	}
	m.labels = make([]int32, rows)
	m.dA = make([]float32, rows*m.a.maxDim())
	m.dB = make([]float32, rows*m.a.maxDim())
	m.rows = rows
}

func general(rows, cols int, data []float32) blas32.General {
	return blas32.General{Rows: rows, Cols: cols, Stride: cols, Data: data[:rows*cols]}
}

// weight and bias return W_l and b_l in buf.
func (m *cpuModel) weight(buf []float32, l int) []float32 {
	off := m.dp.Offset(m.a.wIndex(l, 0))
	return buf[off : off+m.a.out(l)*m.a.in(l)]
}

func (m *cpuModel) bias(buf []float32, l int) []float32 {
	off := m.dp.Offset(m.a.bIndex(l))
	return buf[off : off+m.a.out(l)]
}

func (m *cpuModel) Load(x []float32, labels []int32) error {
	rows := len(labels)
	if len(x) != rows*m.a.dims[0] {
		return fmt.Errorf("batch of %d values for %d rows of %d", len(x), rows, m.a.dims[0])
	}
	m.alloc(rows)
	copy(m.acts[0], x)
	copy(m.labels, labels)
	return nil
}

// forward leaves the logits in acts[L] for rows rows.
func (m *cpuModel) forward(rows int) {
	for l := range m.a.layers() {
		in, out := m.a.in(l), m.a.out(l)
		w, b := m.weight(m.params, l), m.bias(m.params, l)
		y := m.acts[l+1][:rows*out]
		blas32.Gemm(blas.NoTrans, blas.Trans, 1, general(rows, in, m.acts[l]), general(out, in, w), 0, general(rows, out, y))
		relu := l < m.a.layers()-1
		for r := range rows {
			row := y[r*out : (r+1)*out]
			for c := range row {
				v := row[c] + b[c]
				if relu && v < 0 {
					v = 0
				}
				row[c] = v
			}
		}
	}
}

func (m *cpuModel) Step(ctx context.Context) error {
	rows, a := m.rows, m.a
	L := a.layers()
	m.forward(rows)
	// Softmax cross-entropy: mean over the rows.
	classes := a.dims[L]
	g := m.dA[:rows*classes]
	var loss float64
	for r := range rows {
		loss += softmaxXent(m.acts[L][r*classes:(r+1)*classes], int(m.labels[r]), g[r*classes:(r+1)*classes], 1/float32(rows))
	}
	m.loss = float32(loss / float64(rows))
	accum := m.dp.MicroStep() > 0
	var beta float32
	if accum {
		beta = 1
	}
	cur, next := m.dA, m.dB
	for l := L - 1; l >= 0; l-- {
		in, out := a.in(l), a.out(l)
		gy := general(rows, out, cur)
		w, db, dw := m.weight(m.params, l), m.bias(m.grads, l), m.weight(m.grads, l)
		// Input gradient first: W_l is not read after Ready (the optimizer
		// may update it while backward goes on). With DeferUpdate the
		// weight gradient comes first and Release after the input
		// gradient lets the optimizer overwrite W_l.
		weightFirst := m.cfg.DP.DeferUpdate
		inputGrad := func() {
			if l == 0 {
				return
			}
			dx := next[:rows*in]
			blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, gy, general(out, in, w), 0, general(rows, in, dx))
			y := m.acts[l]
			for i := range dx {
				if y[i] <= 0 {
					dx[i] = 0
				}
			}
		}
		if !weightFirst {
			inputGrad()
		}
		blas32.Gemm(blas.Trans, blas.NoTrans, 1, gy, general(rows, in, m.acts[l]), beta, general(out, in, dw))
		for c := range out {
			var s float32
			for r := range rows {
				s += cur[r*out+c]
			}
			if accum {
				db[c] += s
			} else {
				db[c] = s
			}
		}
		if err := m.dp.Ready(ctx, a.bIndex(l)); err != nil {
			return err
		}
		for k := range a.chunks(l) {
			if err := m.dp.Ready(ctx, a.wIndex(l, k)); err != nil {
				return err
			}
		}
		if weightFirst {
			inputGrad()
		}
		if err := m.dp.Release(ctx, a.bIndex(l)); err != nil {
			return err
		}
		for k := range a.chunks(l) {
			if err := m.dp.Release(ctx, a.wIndex(l, k)); err != nil {
				return err
			}
		}
		cur, next = next, cur
	}
	synced, err := m.dp.Finish(ctx)
	if err != nil {
		return err
	}
	if synced {
		m.t++
	}
	return nil
}

// afterReduce applies the optimizer to one bucket as soon as its gradients
// are averaged (on DataParallel's goroutine).
func (m *cpuModel) afterReduce(b worker.Bucket, _ uintptr) error {
	lo, hi := b.Offset, b.Offset+b.Len
	p, g := m.params[lo:hi], m.grads[lo:hi]
	o := m.cfg.Optim
	switch o.Kind {
	case "sgd":
		for i := range p {
			p[i] -= o.LR * g[i]
		}
	case "momentum":
		v := m.state1[lo:hi]
		for i := range p {
			v[i] = o.Momentum*v[i] + g[i]
			p[i] -= o.LR * v[i]
		}
	case "adam":
		t := float64(m.t + 1)
		c1 := float32(1 - math.Pow(float64(o.Beta1), t))
		c2 := float32(1 - math.Pow(float64(o.Beta2), t))
		mm, vv := m.state1[lo:hi], m.state2[lo:hi]
		for i := range p {
			mm[i] = o.Beta1*mm[i] + (1-o.Beta1)*g[i]
			vv[i] = o.Beta2*vv[i] + (1-o.Beta2)*g[i]*g[i]
			p[i] -= o.LR * (mm[i] / c1) / (float32(math.Sqrt(float64(vv[i]/c2))) + o.Eps)
		}
	default:
		return errors.New("unknown optimizer " + o.Kind)
	}
	return nil
}

// softmaxXent returns the cross-entropy of logits against label and writes
// scale × its gradient into grad.
func softmaxXent(logits []float32, label int, grad []float32, scale float32) float64 {
	mx := logits[0]
	for _, v := range logits {
		mx = max(mx, v)
	}
	var sum float32
	for _, v := range logits {
		sum += float32(math.Exp(float64(v - mx)))
	}
	inv := 1 / sum
	for c, v := range logits {
		p := float32(math.Exp(float64(v-mx))) * inv
		if c == label {
			p--
		}
		grad[c] = scale * p
	}
	return math.Log(float64(sum)) + float64(mx) - float64(logits[label])
}

func (m *cpuModel) Loss() (float32, error) { return m.loss, nil }

func (m *cpuModel) Predict(x []float32, rows int) ([]int32, error) {
	m.alloc(rows)
	copy(m.acts[0], x[:rows*m.a.dims[0]])
	m.forward(rows)
	L := m.a.layers()
	classes := m.a.dims[L]
	out := make([]int32, rows)
	for r := range rows {
		row := m.acts[L][r*classes : (r+1)*classes]
		best := 0
		for c, v := range row {
			if v > row[best] {
				best = c
			}
		}
		out[r] = int32(best)
	}
	return out, nil
}

func (m *cpuModel) Params() ([]float32, error) { return append([]float32(nil), m.params...), nil }
func (m *cpuModel) Grads() ([]float32, error)  { return append([]float32(nil), m.grads...), nil }
func (m *cpuModel) Transport() string          { return "host" }
func (m *cpuModel) Sync() error                { return nil }
func (m *cpuModel) SetLR(lr float32)           { m.cfg.Optim.LR = lr }

// State is the parameters and the optimizer's state.
func (m *cpuModel) State() []worker.Buffer {
	st := []worker.Buffer{worker.Host(m.params)}
	for _, p := range [][]float32{m.state1, m.state2} {
		if p != nil {
			st = append(st, worker.Host(p))
		}
	}
	return st
}

func (m *cpuModel) Close() error { return m.dp.Close() }
