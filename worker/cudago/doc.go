// Package cudago helps Go training code use a GPU through gorgonia.org/cu:
// the device's primary context on a locked OS thread, streams, and device
// buffers that go to NCCL collectives without copies.
//
// Everything but this documentation is behind the build tag cuda, because
// gorgonia.org/cu links libcuda and exits the process in its init() when no
// driver is found: a program that imports cudago runs only where a CUDA
// driver is. The gotrain binary never imports it (a test checks); gotrain's
// own GPU work uses gpu/cudadrv, which loads the driver at run time.
//
// # Building
//
// gorgonia.org/cu needs cuda.h and libcuda.so to build (CUDA 11 or 12; it
// does not compile against CUDA 13 headers). On a machine without CUDA,
// scripts/fetch-cuda-stub.sh puts both into build/cuda, and `make gpu`
// builds with them:
//
//	scripts/fetch-cuda-stub.sh
//	CGO_CFLAGS=-I$PWD/build/cuda/include CGO_LDFLAGS=-L$PWD/build/cuda/stubs \
//		go build -tags cuda ./...
//
// # Threads and contexts
//
// A CUDA context is current per OS thread, and goroutines move between
// threads. OnDevice starts one goroutine locked to its OS thread, retains the
// device's primary context and makes it current there; Device.Do runs a
// function on that thread, and every method of Device, Stream and
// DeviceBuffer runs its CUDA calls there. The primary context is the one the
// CUDA runtime, NCCL, PyTorch and worker/ncclcomm use: an ncclcomm.Comm on
// the same device retains the same context on its own thread, so a
// DeviceBuffer's memory goes to its collectives as it is, and its stream
// (Comm.Stream) can be ordered against cudago streams with events
// (Device.WrapStream, Stream.WaitFor).
//
// # Usage
//
//	c, err := w.NewComm(ctx, "grads")   // worker.Worker, --backend nccl
//	nc := c.(*ncclcomm.Comm)
//	d, err := cudago.OnDevice(nc.Device()) // the same device and primary context
//	defer d.Close()
//	s, err := d.NewStream()                // compute stream
//	defer s.Close()
//	commStream := d.WrapStream(nc.Stream()) // ncclcomm's stream
//	defer commStream.Close()
//	grads, err := cudago.Alloc[float32](d, n)
//	defer grads.Free()
//
//	// each step: compute on s (d.Do with cu calls on s.CU() and grads.Ptr()),
//	// then order the communicator's stream after s and average in place
//	err = commStream.WaitFor(s)
//	err = nc.AllReduce(ctx, grads.Buffer(), grads.Buffer(), comm.Avg)
//	err = grads.CopyOutOn(s, host)         // or keep using grads on s
//
// The synchronous collectives of ncclcomm return when the result is in
// device memory, so work enqueued on s afterwards sees it. For overlap, use
// the Async collectives and s.WaitFor(commStream).
package cudago
