package launcher

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/launcher/relay"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// reportCatcher is a CoordinatorClient that keeps the ReportProgress calls.
type reportCatcher struct {
	gotrainv1.CoordinatorClient
	mu   sync.Mutex
	reqs []*gotrainv1.ReportProgressRequest
}

func (c *reportCatcher) ReportProgress(_ context.Context, req *gotrainv1.ReportProgressRequest, _ ...grpc.CallOption) (*gotrainv1.ReportProgressResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, req)
	return &gotrainv1.ReportProgressResponse{}, nil
}

// TestGPUSamplingOffWithoutDriver: without NVML the agent reports progress
// without GPU samples.
func TestGPUSamplingOffWithoutDriver(t *testing.T) {
	old := openNVML
	openNVML = func() (gpuinfo.NVML, error) { return nil, &gpuinfo.NoDriverError{Reason: "test"} }
	t.Cleanup(func() { openNVML = old })
	coord := &reportCatcher{}
	a := &agent{log: slog.New(slog.DiscardHandler), host: "h"}
	a.hub = relay.NewHub(a.log, coord, "node-1")
	var g errgroup.Group
	a.startGPUSampling(t.Context(), &g)
	defer g.Wait()
	if tel := a.hub.Telemetry(); tel == nil || tel.GPUs != nil {
		t.Fatalf("telemetry = %+v, want one without a GPU sampler", a.hub.Telemetry())
	}
	a.hub.Started(0, 0, 0, 0)
	a.hub.Flush(t.Context())
	if len(coord.reqs) != 1 || coord.reqs[0].GetRanks()[0].GetGpu() != nil {
		t.Errorf("reports = %v, want one without a GPU sample", coord.reqs)
	}
}
