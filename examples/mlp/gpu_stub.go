//go:build !cuda

package main

import (
	"context"
	"errors"

	"github.com/gotrain/gotrain/worker"
)

func newGPUModel(context.Context, worker.Comm, modelConfig) (model, error) {
	return nil, errors.New("this binary was built without the GPU path: rebuild it with `go build -tags cuda` (make gpu does)")
}
