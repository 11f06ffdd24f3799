package main

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"
)

// TestGradient compares the backward pass with central finite differences
// of the loss, in float64 arithmetic on the float32 model, on a tiny model.
func TestGradient(t *testing.T) {
	const in, hidden, out, n = 6, 5, 4, 3
	m := newMLP(in, hidden, out)
	m.initWeights(7)
	rng := rand.New(rand.NewPCG(1, 2))
	// Non-zero biases, so that their gradients and the ReLU kink matter.
	p := m.split(m.params)
	for i := range p.b1 {
		p.b1[i] = float32(rng.NormFloat64() * 0.3)
	}
	for i := range p.b2 {
		p.b2[i] = float32(rng.NormFloat64() * 0.3)
	}
	x := make([]float32, n*in)
	for i := range x {
		x[i] = float32(rng.Float64())
	}
	labels := []uint8{0, 3, 1}

	ws := m.newWorkspace(n)
	loss := func() float64 {
		copy(ws.x, x)
		return m.lossAndGrad(ws, labels, make([]float32, m.numParams()))
	}
	grad := make([]float32, m.numParams())
	copy(ws.x, x)
	m.lossAndGrad(ws, labels, grad)

	const h = 1e-2
	var worst float64
	for i := range m.params {
		orig := m.params[i]
		m.params[i] = orig + h
		up := loss()
		m.params[i] = orig - h
		down := loss()
		m.params[i] = orig
		numeric := (up - down) / (2 * h)
		diff := math.Abs(numeric - float64(grad[i]))
		if tol := 2e-3 + 2e-2*math.Abs(numeric); diff > tol {
			t.Errorf("param %d: backward gives %.6f, finite differences %.6f", i, grad[i], numeric)
		}
		worst = max(worst, diff)
	}
	t.Logf("worst absolute difference over %d parameters: %.2g", m.numParams(), worst)
}

func TestSoftmaxXentStable(t *testing.T) {
	row := []float32{1000, 0, -1000}
	if got := softmaxXent(row, 1); math.Abs(got-1000) > 1e-3 {
		t.Errorf("loss of a logit 1000 below the best = %v, want 1000", got)
	}
	if row[0] != 1 || row[1] != 0 {
		t.Errorf("probabilities %v, want [1 0 0]", row)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := defaultConfig().validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*config)
		want string
	}{
		{"epochs", func(c *config) { c.Epochs = 0 }, "epochs"},
		{"batch", func(c *config) { c.BatchSize = -1 }, "batch size"},
		{"hidden", func(c *config) { c.Hidden = 0 }, "hidden"},
		{"lr", func(c *config) { c.LR = math.NaN() }, "learning rate"},
		{"momentum", func(c *config) { c.Momentum = 1 }, "momentum"},
		{"limit", func(c *config) { c.Limit = -5 }, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := defaultConfig()
			tc.edit(&c)
			if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one about %s", err, tc.want)
			}
		})
	}
}

// TestTrainOneRank trains on a few thousand images and checks that the
// model learned something, that rank 0's output has the promised shape, and
// that the same seed gives the same weights.
func TestTrainOneRank(t *testing.T) {
	ds := testData(t)
	cfg := defaultConfig()
	cfg.Limit = 4000
	cfg.Epochs = 3
	var out bytes.Buffer
	start := time.Now()
	res, err := train(t.Context(), soloComm{}, ds, cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v in %v:\n%s", cfg, time.Since(start).Round(time.Millisecond), out.String())
	if res.TestAccuracy < 0.85 {
		t.Errorf("test accuracy %.4f after %d epochs on %d images, want at least 0.85", res.TestAccuracy, cfg.Epochs, cfg.Limit)
	}
	if !res.RanksAgree {
		t.Error("one rank disagrees with itself")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != cfg.Epochs+1 {
		t.Fatalf("%d lines of output, want %d", len(lines), cfg.Epochs+1)
	}
	for i, l := range lines[:cfg.Epochs] {
		if want := fmt.Sprintf("epoch=%d loss=", i+1); !strings.HasPrefix(l, want) || !strings.Contains(l, " test_accuracy=") || !strings.HasSuffix(l, "s") {
			t.Errorf("line %q, want %q… test_accuracy=… elapsed=…s", l, want)
		}
	}
	if want := "final test_accuracy=" + formatAccuracy(res.TestAccuracy) + " ranks_agree=true"; lines[cfg.Epochs] != want {
		t.Errorf("last line %q, want %q", lines[cfg.Epochs], want)
	}

	again, err := train(t.Context(), soloComm{}, ds, cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if again.WeightHash != res.WeightHash {
		t.Errorf("the same seed gave weight hashes %#x and %#x", res.WeightHash, again.WeightHash)
	}
}

func TestTrainTooFewImages(t *testing.T) {
	ds := &mnistdata.Dataset{Train: mnistdata.Split{Pixels: make([]uint8, 2*mnistdata.Pixels), Labels: []uint8{1, 2}}}
	cfg := defaultConfig()
	_, err := train(t.Context(), fakeSize{soloComm{}, 3}, ds, cfg, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Fatalf("err = %v, want one about too few images", err)
	}
}

// fakeSize claims a world size it does not have; only for tests that fail
// before the first collective.
type fakeSize struct {
	soloComm
	size int
}

func (f fakeSize) Size() int { return f.size }

// train reports every step, in order, from the first (0) to the last, with a
// positive rate after each step.
func TestTrainReportsSteps(t *testing.T) {
	ds := testData(t)
	cfg := defaultConfig()
	cfg.Limit, cfg.Epochs, cfg.BatchSize = 320, 2, 32
	var steps []int64
	cfg.ReportStep = func(step int64, sps float64) {
		if step > 0 && !(sps > 0) {
			t.Errorf("step %d reported %v samples/s, want more than 0", step, sps)
		}
		steps = append(steps, step)
	}
	if _, err := train(t.Context(), soloComm{}, ds, cfg, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	want := int64(cfg.Epochs * cfg.Limit / cfg.BatchSize)
	if len(steps) != int(want)+1 {
		t.Fatalf("reported steps %v, want 0 to %d", steps, want)
	}
	for i, s := range steps {
		if s != int64(i) {
			t.Fatalf("reported steps %v, want 0 to %d", steps, want)
		}
	}
}
