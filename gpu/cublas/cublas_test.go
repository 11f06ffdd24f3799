package cublas

import (
	"errors"
	"strings"
	"testing"
)

func TestNotFoundIsOneLine(t *testing.T) {
	_, err := open([]string{"libgotrain-no-such-cublas.so.99", "/nonexistent/libcublas.so.13"})
	if err == nil {
		t.Fatal("open of missing libraries succeeded")
	}
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("error %v does not match ErrNotFound", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "LD_LIBRARY_PATH") || !strings.Contains(msg, "/nonexistent/libcublas.so.13") {
		t.Errorf("error is not one line naming what was tried and what to do: %q", msg)
	}
}

func TestCallsBeforeLoad(t *testing.T) {
	if loaded != nil {
		t.Skip("cuBLAS is loaded")
	}
	if _, err := New(); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("New before Load: %v, want ErrNotLoaded", err)
	}
	if err := Handle(0).Sgemm(N, N, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 1); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("Sgemm before Load: %v, want ErrNotLoaded", err)
	}
	if err := Handle(0).SetSmCountTarget(8); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("SetSmCountTarget before Load: %v, want ErrNotLoaded", err)
	}
}

// An optional entry point missing from an older cuBLAS says which one is needed.
func TestMissingSymbolNamesVersion(t *testing.T) {
	err := check("cublasSetSmCountTarget", missingSymbol)
	if err == nil || !strings.Contains(err.Error(), "cublasSetSmCountTarget") || !strings.Contains(err.Error(), "cuBLAS 11.3") {
		t.Errorf("got %v, want an error naming cublasSetSmCountTarget and cuBLAS 11.3", err)
	}
}

func TestStatusText(t *testing.T) {
	if got := (&Status{Op: "cublasSgemm", Code: 7}).Error(); got != "cublas: cublasSgemm: CUBLAS_STATUS_INVALID_VALUE" {
		t.Errorf("got %q", got)
	}
	if got := (&Status{Op: "x", Code: 99}).Error(); !strings.Contains(got, "99") {
		t.Errorf("got %q", got)
	}
}
