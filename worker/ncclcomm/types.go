package ncclcomm

import (
	"fmt"

	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
)

// The NCCL bindings (package nccl) know nothing of gotrain's data-plane
// types; the mapping between the two lives here, with the only package that
// needs both.

// NCCLType returns the NCCL type of a gotrain element type.
func NCCLType(d comm.DType) (nccl.DataType, error) {
	switch d {
	case comm.Float32:
		return nccl.Float32, nil
	case comm.Float64:
		return nccl.Float64, nil
	case comm.Int32:
		return nccl.Int32, nil
	case comm.Int64:
		return nccl.Int64, nil
	}
	return 0, fmt.Errorf("nccl: no NCCL type for %s", d)
}

// NCCLOp returns the NCCL reduction of a gotrain reduction.
func NCCLOp(o comm.Op) (nccl.RedOp, error) {
	switch o {
	case comm.Sum:
		return nccl.Sum, nil
	case comm.Avg:
		return nccl.Avg, nil
	case comm.Max:
		return nccl.Max, nil
	case comm.Min:
		return nccl.Min, nil
	}
	return 0, fmt.Errorf("nccl: no NCCL reduction for %s", o)
}
