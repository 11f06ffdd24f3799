//go:build cuda

package cudago_test

import (
	"context"
	"fmt"
	"log"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cudago"
	"github.com/gotrain/gotrain/worker/ncclcomm"
	"gorgonia.org/cu"
)

// A worker averages gradients that live on its GPU: cudago and the NCCL
// communicator share the device's primary context, so the buffer goes to
// NCCL as it is. Run under `gotrain launch --backend nccl`.
func Example() {
	ctx := context.Background()
	w, err := worker.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	c, err := w.NewComm(ctx, "grads")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	nc, ok := c.(*ncclcomm.Comm)
	if !ok {
		log.Fatal("not on the NCCL backend: run with gotrain launch --backend nccl")
	}

	d, err := cudago.OnDevice(nc.Device())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	// Both threads have the same context current.
	var commCtx cu.CUContext
	if err := nc.Do(func() (err error) { commCtx, err = cu.CurrentContext(); return err }); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shared context:", commCtx == d.Context())

	s, err := d.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	grads, err := cudago.Alloc[float32](d, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	defer grads.Free()

	host := make([]float32, grads.Len())
	for i := range host {
		host[i] = float32(c.Rank() + 1)
	}
	// The backward pass would run on s; here a copy stands in for it.
	if err := grads.CopyInOn(s, host); err != nil {
		log.Fatal(err)
	}
	// The communicator's stream waits for s on the GPU, not the host.
	commStream := d.WrapStream(nc.Stream())
	defer commStream.Close()
	if err := commStream.WaitFor(s); err != nil {
		log.Fatal(err)
	}
	if err := nc.AllReduce(ctx, grads.Buffer(), grads.Buffer(), comm.Avg); err != nil {
		log.Fatal(err)
	}
	if err := grads.CopyOutOn(s, host); err != nil {
		log.Fatal(err)
	}
	fmt.Println("average:", host[0])
}
