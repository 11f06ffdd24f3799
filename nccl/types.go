package nccl

import (
	"errors"
	"fmt"
)

// Result is an ncclResult_t. It is an error, so that errors.Is(err,
// nccl.InProgress) matches an *Error carrying that result.
type Result int32

// The values of ncclResult_t.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7 // a non-blocking communicator is still working; poll Comm.Wait
	Timeout            Result = 8 // NCCL 2.29 and newer
)

var resultNames = [...]string{
	Success: "ncclSuccess", UnhandledCudaError: "ncclUnhandledCudaError", SystemError: "ncclSystemError",
	InternalError: "ncclInternalError", InvalidArgument: "ncclInvalidArgument", InvalidUsage: "ncclInvalidUsage",
	RemoteError: "ncclRemoteError", InProgress: "ncclInProgress", Timeout: "ncclTimeout",
}

func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// Error returns the result's name, so that a Result can be an errors.Is target.
func (r Result) Error() string { return "nccl: " + r.String() }

// Error is a failed NCCL call, with NCCL's own words for it.
type Error struct {
	Op      string // the NCCL function, e.g. "ncclAllReduce"
	Result  Result
	Message string // ncclGetErrorString(Result)
	Detail  string // ncclGetLastError at the time of the failure; may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (%s)", e.Op, e.Message, e.Result.String())
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is reports whether target is e's Result.
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Result
}

// newError builds the error of a failed call; comm is the communicator the
// call used (0 when none), whose last error NCCL reports.
func newError(op string, r Result, comm uintptr) error {
	return &Error{Op: op, Result: r, Message: cErrorString(r), Detail: cLastError(comm)}
}

// ErrClosed is returned by a Comm that was destroyed or aborted.
var ErrClosed = errors.New("nccl: communicator is destroyed or aborted")

// Version is an NCCL_VERSION_CODE: 22803 is 2.28.3; releases before 2.9
// used the older encoding 2708 for 2.7.8.
type Version int

// MakeVersion returns the code of major.minor.patch, as NCCL's NCCL_VERSION macro does.
func MakeVersion(major, minor, patch int) Version {
	if major <= 2 && minor <= 8 {
		return Version(major*1000 + minor*100 + patch)
	}
	return Version(major*10000 + minor*100 + patch)
}

// Parts returns major, minor and patch.
func (v Version) Parts() (major, minor, patch int) {
	n := int(v)
	if n < 10000 {
		return n / 1000, n % 1000 / 100, n % 100
	}
	return n / 10000, n % 10000 / 100, n % 100
}

func (v Version) String() string {
	a, b, c := v.Parts()
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}

// UniqueID is an ncclUniqueId: the bootstrap address rank 0 creates with
// GetUniqueID and every rank passes to InitRank.
type UniqueID [128]byte

// UniqueIDFromBytes returns the UniqueID in b, which must hold 128 bytes.
func UniqueIDFromBytes(b []byte) (UniqueID, error) {
	var id UniqueID
	if len(b) != len(id) {
		return id, fmt.Errorf("nccl: a unique id has %d bytes, got %d", len(id), len(b))
	}
	copy(id[:], b)
	return id, nil
}

// DataType is an ncclDataType_t.
type DataType int32

// The values of ncclDataType_t.
const (
	Int8       DataType = 0
	Uint8      DataType = 1
	Int32      DataType = 2
	Uint32     DataType = 3
	Int64      DataType = 4
	Uint64     DataType = 5
	Float16    DataType = 6
	Float32    DataType = 7
	Float64    DataType = 8
	BFloat16   DataType = 9  // NCCL 2.10 and newer
	Float8E4M3 DataType = 10 // needs a GPU of compute capability 9.0 or newer
	Float8E5M2 DataType = 11 // needs a GPU of compute capability 9.0 or newer
)

var dataTypeInfo = [...]struct {
	name string
	size int
}{
	Int8: {"int8", 1}, Uint8: {"uint8", 1}, Int32: {"int32", 4}, Uint32: {"uint32", 4},
	Int64: {"int64", 8}, Uint64: {"uint64", 8}, Float16: {"float16", 2}, Float32: {"float32", 4},
	Float64: {"float64", 8}, BFloat16: {"bfloat16", 2}, Float8E4M3: {"float8e4m3", 1}, Float8E5M2: {"float8e5m2", 1},
}

func (d DataType) valid() bool { return d >= 0 && int(d) < len(dataTypeInfo) }

func (d DataType) String() string {
	if d.valid() {
		return dataTypeInfo[d].name
	}
	return fmt.Sprintf("DataType(%d)", int32(d))
}

// Size returns the size of one element in bytes, or 0 for an unknown type.
func (d DataType) Size() int {
	if d.valid() {
		return dataTypeInfo[d].size
	}
	return 0
}

// RedOp is an ncclRedOp_t.
type RedOp int32

// The built-in values of ncclRedOp_t.
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4 // NCCL 2.10 and newer
)

var redOpNames = [...]string{Sum: "sum", Prod: "prod", Max: "max", Min: "min", Avg: "avg"}

func (o RedOp) String() string {
	if o >= 0 && int(o) < len(redOpNames) {
		return redOpNames[o]
	}
	return fmt.Sprintf("RedOp(%d)", int32(o))
}
