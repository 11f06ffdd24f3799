package main

import (
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// mlp is a two-layer perceptron, in → hidden (ReLU) → out, trained with
// softmax cross-entropy. All its parameters live in one contiguous slice so
// that the gradient, laid out the same way, is all-reduced in one call.
//
// Layout of params (and of every gradient): w1 (in×hidden, row-major),
// b1 (hidden), w2 (hidden×out, row-major), b2 (out).
type mlp struct {
	in, hidden, out int
	params          []float32
}

func newMLP(in, hidden, out int) *mlp {
	m := &mlp{in: in, hidden: hidden, out: out}
	m.params = make([]float32, m.numParams())
	return m
}

func (m *mlp) numParams() int { return m.in*m.hidden + m.hidden + m.hidden*m.out + m.out }

// layers is one parameter-shaped slice cut into its four tensors.
type layers struct {
	w1, w2 blas32.General
	b1, b2 []float32
}

// split cuts buf, which holds numParams elements, into the model's tensors.
func (m *mlp) split(buf []float32) layers {
	if len(buf) != m.numParams() {
		panic("mnist: parameter buffer of the wrong size")
	}
	var l layers
	n := m.in * m.hidden
	l.w1 = blas32.General{Rows: m.in, Cols: m.hidden, Stride: m.hidden, Data: buf[:n:n]}
	buf = buf[n:]
	l.b1, buf = buf[:m.hidden:m.hidden], buf[m.hidden:]
	n = m.hidden * m.out
	l.w2 = blas32.General{Rows: m.hidden, Cols: m.out, Stride: m.out, Data: buf[:n:n]}
	l.b2 = buf[n:]
	return l
}

// initWeights draws He-initialised weights from seed and zeroes the biases.
// Every rank that calls it with the same seed gets the same parameters.
func (m *mlp) initWeights(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x6d6e697374)) // "mnist"
	p := m.split(m.params)
	fill := func(w []float32, fanIn int) {
		std := math.Sqrt(2 / float64(fanIn))
		for i := range w {
			w[i] = float32(rng.NormFloat64() * std)
		}
	}
	fill(p.w1.Data, m.in)
	fill(p.w2.Data, m.hidden)
	clear(p.b1)
	clear(p.b2)
}

// workspace holds the activations of one batch of up to cap examples.
type workspace struct {
	cap  int
	x    []float32 // cap × in: the inputs
	act  []float32 // cap × hidden: ReLU outputs, then their gradients
	grad []float32 // cap × hidden: the gradient wrt the hidden layer
	z    []float32 // cap × out: logits, then probabilities, then their gradients
}

func (m *mlp) newWorkspace(capacity int) *workspace {
	return &workspace{
		cap:  capacity,
		x:    make([]float32, capacity*m.in),
		act:  make([]float32, capacity*m.hidden),
		grad: make([]float32, capacity*m.hidden),
		z:    make([]float32, capacity*m.out),
	}
}

func general(rows, cols int, data []float32) blas32.General {
	return blas32.General{Rows: rows, Cols: cols, Stride: cols, Data: data[: rows*cols : rows*cols]}
}

// forward computes the logits of the n examples in ws.x into ws.z, keeping
// the hidden activations in ws.act.
func (m *mlp) forward(ws *workspace, n int) {
	p := m.split(m.params)
	x := general(n, m.in, ws.x)
	a := general(n, m.hidden, ws.act)
	z := general(n, m.out, ws.z)
	blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, x, p.w1, 0, a)
	for i := range n {
		row := a.Data[i*m.hidden : (i+1)*m.hidden]
		for j, b := range p.b1 {
			row[j] = max(row[j]+b, 0)
		}
	}
	blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, a, p.w2, 0, z)
	for i := range n {
		row := z.Data[i*m.out : (i+1)*m.out]
		for j, b := range p.b2 {
			row[j] += b
		}
	}
}

// lossAndGrad runs the n examples in ws.x with their labels forward and
// backward. It writes the gradient of the mean cross-entropy loss into grad
// (numParams elements) and returns that mean loss.
func (m *mlp) lossAndGrad(ws *workspace, labels []uint8, grad []float32) float64 {
	n := len(labels)
	m.forward(ws, n)
	p := m.split(m.params)
	g := m.split(grad)
	x := general(n, m.in, ws.x)
	a := general(n, m.hidden, ws.act)
	da := general(n, m.hidden, ws.grad)
	dz := general(n, m.out, ws.z)

	// Softmax and cross-entropy; dz = (softmax − onehot) / n.
	var loss float64
	inv := 1 / float32(n)
	for i, y := range labels {
		row := dz.Data[i*m.out : (i+1)*m.out]
		loss += softmaxXent(row, y)
		row[y]--
		for j := range row {
			row[j] *= inv
		}
	}

	// Output layer.
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, a, dz, 0, g.w2)
	colSums(g.b2, dz)
	// Back through w2 and the ReLU.
	blas32.Gemm(blas.NoTrans, blas.Trans, 1, dz, p.w2, 0, da)
	for i, v := range a.Data {
		if v <= 0 {
			da.Data[i] = 0
		}
	}
	// Hidden layer.
	blas32.Gemm(blas.Trans, blas.NoTrans, 1, x, da, 0, g.w1)
	colSums(g.b1, da)
	return loss / float64(n)
}

// softmaxXent replaces the logits in row by their softmax and returns the
// cross-entropy −log p_y, computed from the logits so that it stays finite
// when p_y underflows.
func softmaxXent(row []float32, y uint8) float64 {
	hi := row[0]
	for _, v := range row[1:] {
		hi = max(hi, v)
	}
	shifted := float64(row[y] - hi)
	var sum float64
	for j, v := range row {
		e := math.Exp(float64(v - hi))
		row[j] = float32(e)
		sum += e
	}
	for j := range row {
		row[j] = float32(float64(row[j]) / sum)
	}
	return math.Log(sum) - shifted
}

// colSums sets dst[j] to the sum of column j of a.
func colSums(dst []float32, a blas32.General) {
	clear(dst)
	for i := range a.Rows {
		for j, v := range a.Data[i*a.Stride : i*a.Stride+a.Cols] {
			dst[j] += v
		}
	}
}

// countCorrect runs the n examples in ws.x forward and returns how many of
// them the model classifies as labels says.
func (m *mlp) countCorrect(ws *workspace, labels []uint8) int {
	n := len(labels)
	m.forward(ws, n)
	correct := 0
	for i, y := range labels {
		row := ws.z[i*m.out : (i+1)*m.out]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if best == int(y) {
			correct++
		}
	}
	return correct
}
