package ncclcomm

import (
	"testing"

	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
)

func TestNCCLTypesAndOps(t *testing.T) {
	for _, tc := range []struct {
		in   comm.DType
		want nccl.DataType
	}{{comm.Float32, nccl.Float32}, {comm.Float64, nccl.Float64}, {comm.Int32, nccl.Int32}, {comm.Int64, nccl.Int64}} {
		if got, err := NCCLType(tc.in); err != nil || got != tc.want {
			t.Errorf("NCCLType(%s) = %s, %v", tc.in, got, err)
		}
	}
	for _, tc := range []struct {
		in   comm.Op
		want nccl.RedOp
	}{{comm.Sum, nccl.Sum}, {comm.Avg, nccl.Avg}, {comm.Max, nccl.Max}, {comm.Min, nccl.Min}} {
		if got, err := NCCLOp(tc.in); err != nil || got != tc.want {
			t.Errorf("NCCLOp(%s) = %s, %v", tc.in, got, err)
		}
	}
	if _, err := NCCLType(comm.DType(42)); err == nil {
		t.Error("NCCLType(42) should fail")
	}
}
