package benchrun

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"8", 8, false}, {"64K", 64 << 10, false}, {"4M", 4 << 20, false}, {"4G", 4 << 30, false},
		{"2gib", 2 << 30, false}, {"1KB", 1024, false}, {"x", 0, true}, {"-1", 0, true}, {"", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestShapes(t *testing.T) {
	s := DefaultSpec(AllReduce)
	sh := s.Shapes(2)
	if len(sh) != 15 || sh[0].Bytes != 8 || sh[len(sh)-1].Bytes != 2<<30 {
		t.Fatalf("allreduce 8..4G ×4: %d sizes, %+v … %+v; want 15 from 8 B to 2 GiB", len(sh), sh[0], sh[len(sh)-1])
	}
	s = Spec{Op: AllGather, Min: 8, Max: 100, Factor: 4, DType: "float32", RedOp: "sum", Iters: 1}
	got := s.Shapes(4)
	// 8 B = 2 elements: fewer than one per rank, so 4 (one each); 32 B = 8 elements.
	want := []Shape{{Bytes: 16, Count: 4, SendCount: 1, RecvCount: 4}, {Bytes: 32, Count: 8, SendCount: 2, RecvCount: 8}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("all_gather shapes on 4 ranks: %+v, want %+v", got, want)
	}
	s.Op = ReduceScatter
	if g := s.Shapes(4)[1]; g.SendCount != 8 || g.RecvCount != 2 {
		t.Fatalf("reduce_scatter shape: %+v", g)
	}
}

func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op   string
		n    int
		want float64
	}{{AllReduce, 2, 1}, {AllReduce, 8, 1.75}, {AllGather, 4, 0.75}, {ReduceScatter, 2, 0.5}, {Broadcast, 8, 1}} {
		if got := BusFactor(tc.op, tc.n); got != tc.want {
			t.Errorf("BusFactor(%s, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Spec)
		want string
	}{
		{func(s *Spec) { s.Op = "alltoall" }, "unknown collective"},
		{func(s *Spec) { s.DType = "bf16" }, "unknown dtype"},
		{func(s *Spec) { s.Min = 2 }, "less than one float32"},
		{func(s *Spec) { s.Max = 4 }, "below --min"},
		{func(s *Spec) { s.Factor = 1 }, "--factor"},
		{func(s *Spec) { s.Iters = 0 }, "--iters"},
		{func(s *Spec) { s.Op = Broadcast; s.Root = 2 }, "--root 2"},
	} {
		s := DefaultSpec(AllReduce)
		tc.mod(&s)
		if err := s.Validate(2); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
		}
	}
}

// simulate computes what a correct collective leaves in rank me's recv, from
// every rank's pattern, independently of expect.
func simulate(s Spec, sh Shape, n, me int) []float64 {
	out := make([]float64, sh.RecvCount)
	for i := range out {
		switch s.Op {
		case AllReduce, ReduceScatter:
			idx := int64(i)
			if s.Op == ReduceScatter {
				idx += int64(me) * sh.RecvCount
			}
			vals := make([]float64, n)
			for q := range vals {
				vals[q] = val(q, idx)
			}
			out[i] = reduceVals(s.redOp(), vals, s.dtype())
		case AllGather:
			out[i] = val(i/int(sh.SendCount), int64(i)%sh.SendCount)
		case Broadcast:
			out[i] = val(s.Root, int64(i))
		}
	}
	return out
}

func encode(dt comm.DType, vs []float64) []byte {
	b := make([]byte, len(vs)*dt.Size())
	switch dt {
	case comm.Float32:
		for i, v := range vs {
			typed[float32](b)[i] = float32(v)
		}
	case comm.Float64:
		copy(typed[float64](b), vs)
	case comm.Int32:
		for i, v := range vs {
			typed[int32](b)[i] = int32(v)
		}
	case comm.Int64:
		for i, v := range vs {
			typed[int64](b)[i] = int64(v)
		}
	}
	return b
}

// TestCheckCountsWrongElements: a correct result has no wrong element, and
// each corrupted element is counted, for every collective, dtype and op.
func TestCheckCountsWrongElements(t *testing.T) {
	const n = 3
	for _, op := range Ops {
		for _, dt := range []string{"float32", "float64", "int32", "int64"} {
			for _, red := range []string{"sum", "avg", "max", "min"} {
				s := Spec{Op: op, Min: 1000, Max: 1000, Factor: 2, DType: dt, RedOp: red, Root: 1, Iters: 1}
				sh := s.Shapes(n)[0]
				for me := range n {
					good := simulate(s, sh, n, me)
					b := encode(s.dtype(), good)
					if w := countWrong(s.dtype(), b, expect(s, sh, n, me)); w != 0 {
						t.Fatalf("%s %s %s rank %d: %d wrong in a correct result", op, dt, red, me, w)
					}
					bad := append([]float64(nil), good...)
					bad[0] += 1
					bad[len(bad)-1] = 0
					if w := countWrong(s.dtype(), encode(s.dtype(), bad), expect(s, sh, n, me)); w != 2 {
						t.Fatalf("%s %s %s rank %d: %d wrong, want 2", op, dt, red, me, w)
					}
				}
			}
		}
	}
}

func TestTable(t *testing.T) {
	rep := &Report{Spec: DefaultSpec(AllReduce), Backend: "nccl", Ranks: 2, NCCL: "2.28.3", Devices: []string{"NVIDIA H200"},
		Rows: []Row{{Op: AllReduce, Bytes: 8, Count: 2, Type: "float32", RedOp: "sum", Root: -1, TimeUs: 7.51, AlgBW: 0.001, BusBW: 0.001},
			{Op: AllReduce, Bytes: 2 << 30, Count: 1 << 29, Type: "float32", RedOp: "sum", Root: -1, TimeUs: 6300, AlgBW: 340.87, BusBW: 340.87, Wrong: 3}}}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"NCCL 2.28.3", "NVIDIA H200", "7.51", "2147483648", "340.87", "Out of bounds values : 3 WRONG"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := (&Report{}).WriteJSON(&b); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Errorf("empty report as JSON: %q, %v; want []", b.String(), err)
	}
}
