// Package cublas is the part of cuBLAS that gotrain's GPU example uses,
// public for Go GPU programs beside package cudadrv: handles bound to a
// stream, the math mode, the SM count target, Sgemm and GemmEx (bfloat16
// inputs, float32 accumulation). Like packages nccl and cudadrv it dlopens
// the library at run time with gotrain's own declarations, so it builds
// without CUDA; Load returns one line saying what is missing.
//
// cuBLAS is column-major. A handle belongs to the context current when it
// was created (use the device's primary context, on a locked OS thread, as
// package cudadrv describes); its calls enqueue on its stream and return.
package cublas

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

const (
	notLoaded     = -1 // GTB_NOT_LOADED
	missingSymbol = -2 // GTB_MISSING: an optional entry point the library lacks
)

// needs names the cuBLAS that brings each optional entry point.
var needs = map[string]string{"cublasSetSmCountTarget": "cuBLAS 11.3"}

// Op says whether a GEMM operand is used as stored or transposed (cublasOperation_t).
type Op int

const (
	N Op = 0 // CUBLAS_OP_N
	T Op = 1 // CUBLAS_OP_T
)

// DataType is a cudaDataType of GemmEx's matrices.
type DataType int

const (
	R32F  DataType = 0  // CUDA_R_32F
	R16F  DataType = 2  // CUDA_R_16F
	R16BF DataType = 14 // CUDA_R_16BF
)

// ComputeType is a cublasComputeType_t.
type ComputeType int

const (
	Compute32F         ComputeType = 68 // CUBLAS_COMPUTE_32F
	Compute32FFastTF32 ComputeType = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
)

// MathMode is a cublasMath_t.
type MathMode int

const (
	// DefaultMath: float32 GEMMs in full float32 (no TF32). What New sets.
	DefaultMath MathMode = 0
	// PedanticMath: the reference algorithms, no reduced precision anywhere.
	PedanticMath MathMode = 2
	// TF32Math lets float32 GEMMs use TF32 tensor cores (10-bit mantissa).
	TF32Math MathMode = 3
)

const gemmDefault = -1 // CUBLAS_GEMM_DEFAULT

// ErrNotFound matches Load's error when no cuBLAS library could be opened.
var ErrNotFound = errors.New("cublas: cuBLAS not found")

// ErrNotLoaded is returned by calls made before Load succeeded.
var ErrNotLoaded = errors.New("cublas: cuBLAS is not loaded (call Load first)")

// Status is a failed cuBLAS call's cublasStatus_t.
type Status struct {
	Op   string
	Code int
}

var statusNames = map[int]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
	8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func (s *Status) Error() string {
	name := statusNames[s.Code]
	if name == "" {
		name = fmt.Sprintf("cublasStatus %d", s.Code)
	}
	return fmt.Sprintf("cublas: %s: %s", s.Op, name)
}

func check(op string, r int) error {
	switch r {
	case 0:
		return nil
	case notLoaded:
		return ErrNotLoaded
	case missingSymbol:
		return fmt.Errorf("cublas: %s is not in the loaded cuBLAS (%s or newer needed)", op, needs[op])
	}
	return &Status{Op: op, Code: r}
}

// Candidates are the libraries Load tries, in order: the loader's path first
// for each soname, then CUDA's and PyTorch's usual places.
var Candidates = []string{
	"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
	"/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.11",
}

// Library is the loaded cuBLAS.
type Library struct{ path string }

// Path returns the library Load opened.
func (l *Library) Path() string { return l.path }

var (
	loadMu sync.Mutex
	loaded *Library
)

// Load opens cuBLAS (the first of Candidates that opens), or returns the
// Library it loaded before. A failure is not remembered.
func Load() (*Library, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	path, err := open(Candidates)
	if err != nil {
		return nil, err
	}
	loaded = &Library{path: path}
	return loaded, nil
}

type notFoundError struct {
	first string
	tried []string
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("cublas: cuBLAS not found (%s; tried %s): install the CUDA toolkit's libcublas (e.g. apt-get install libcublas-13-0) or add its directory to LD_LIBRARY_PATH",
		e.first, strings.Join(e.tried, ", "))
}

func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

func open(paths []string) (string, error) {
	nf := &notFoundError{tried: paths}
	for i, p := range paths {
		msg := cOpen(p)
		if msg == "" {
			return p, nil
		}
		if i == 0 {
			nf.first = msg
		}
		if strings.Contains(msg, "lacks") { // found, but too old: say that
			return "", fmt.Errorf("cublas: %s", msg)
		}
	}
	return "", nf
}

// Handle is a cublasHandle_t.
type Handle uintptr

// New creates a handle in the current context (cublasCreate) with DefaultMath:
// float32 GEMMs do not use TF32.
func New() (Handle, error) {
	h, r := cCreate()
	if err := check("cublasCreate", r); err != nil {
		return 0, err
	}
	if err := check("cublasSetMathMode", cSetMathMode(h, int(DefaultMath))); err != nil {
		cDestroy(h)
		return 0, err
	}
	return Handle(h), nil
}

// Version returns cuBLAS's version, e.g. 130000 (cublasGetVersion).
func (h Handle) Version() (int, error) {
	v, r := cGetVersion(uintptr(h))
	return v, check("cublasGetVersion", r)
}

// Destroy releases h (cublasDestroy).
func (h Handle) Destroy() error { return check("cublasDestroy", cDestroy(uintptr(h))) }

// SetStream makes h enqueue on stream (a CUstream; cublasSetStream).
func (h Handle) SetStream(stream uintptr) error {
	return check("cublasSetStream", cSetStream(uintptr(h), stream))
}

// SetMathMode sets h's math mode (cublasSetMathMode).
func (h Handle) SetMathMode(m MathMode) error {
	return check("cublasSetMathMode", cSetMathMode(uintptr(h), int(m)))
}

// SetSmCountTarget makes the kernels h enqueues from now on aim at n SMs,
// leaving the others to kernels running beside them; 0 restores cuBLAS's
// choice (cublasSetSmCountTarget, cuBLAS 11.3 or newer).
func (h Handle) SetSmCountTarget(n int) error {
	return check("cublasSetSmCountTarget", cSetSmCountTarget(uintptr(h), n))
}

// Sgemm enqueues C = alpha·op(A)·op(B) + beta·C on float32 matrices in
// column-major order: op(A) is m×k, op(B) k×n, C m×n (cublasSgemm).
func (h Handle) Sgemm(ta, tb Op, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) error {
	return check("cublasSgemm", cSgemm(uintptr(h), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
}

// GemmEx is Sgemm with the matrices' types given (cublasGemmEx, default
// algorithm): for bfloat16 GEMMs, A and B in R16BF, C in R32F, Compute32F.
func (h Handle) GemmEx(ta, tb Op, m, n, k int, alpha float32, a uintptr, at DataType, lda int, b uintptr, bt DataType, ldb int, beta float32, c uintptr, ct DataType, ldc int, compute ComputeType) error {
	return check("cublasGemmEx", cGemmEx(uintptr(h), ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute))
}
