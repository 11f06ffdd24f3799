package worker

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/internal/testing/gputest"
	"github.com/gotrain/gotrain/worker/comm"
)

// snapshotsOn is a rank's Snapshots on a real agent-side server in this
// process.
func snapshotsOn(t *testing.T, sock string) *Snapshots {
	t.Helper()
	c, err := memsnap.Dial(t.Context(), sock, "tok", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &Snapshots{rank: 0, log: slog.New(slog.DiscardHandler), c: c, held: -1}
}

// A state on the GPU (two device buffers, one large enough to be
// page-locked on restore, and a host buffer between them) is snapshotted to
// the agent's memory, the writer goes away, and a new Snapshots restores it
// into zeroed device buffers: byte for byte what was saved, from the agent.
func TestGPUSnapshotOfDeviceState(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	drv, err := cudadrv.Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and a GPU: %v", err)
	}
	dev, err := drv.Device(0)
	if err != nil {
		gputest.Skipf(t, "needs a GPU: %v", err)
	}
	cctx, err := dev.RetainPrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dev.ReleasePrimaryContext() }()
	if err := cctx.SetCurrent(); err != nil {
		t.Fatal(err)
	}
	const big, small = 80 << 20, 4 << 10
	p1, err := cudadrv.MemAlloc(big)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Free()
	p2, err := cudadrv.MemAlloc(small)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Free()
	if err := cudadrv.MemsetD32(p1, 0x9e3779b9, big/4); err != nil {
		t.Fatal(err)
	}
	if err := cudadrv.MemsetD8(p1+big/3, 0x5a, big/7); err != nil {
		t.Fatal(err)
	}
	if err := cudadrv.MemsetD32(p2, 0x01020304, small/4); err != nil {
		t.Fatal(err)
	}
	host := make([]float32, 300)
	for i := range host {
		host[i] = float32(i) / 7
	}
	state := func() []Buffer {
		return []Buffer{comm.Device(uintptr(p1), big/4, Float32), Host(host), comm.Device(uintptr(p2), small/4, Float32)}
	}
	want1, want2 := make([]byte, big), make([]byte, small)
	if err := cudadrv.CopyFromDevice(want1, p1); err != nil {
		t.Fatal(err)
	}
	if err := cudadrv.CopyFromDevice(want2, p2); err != nil {
		t.Fatal(err)
	}
	wantHost := append([]float32(nil), host...)

	st := memsnap.NewStore(0)
	defer st.Close()
	sock := filepath.Join(t.TempDir(), memsnap.SocketName)
	lis, err := memsnap.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = (&memsnap.Server{Store: st, Token: "tok"}).Serve(ctx, lis) }()

	w := snapshotsOn(t, sock)
	if !w.Save(41, state()...) {
		t.Fatal("Save skipped the first snapshot")
	}
	if err := w.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil { // the writer is gone
		t.Fatal(err)
	}

	for _, p := range []cudadrv.DevicePtr{p1, p2} {
		n := big
		if p == p2 {
			n = small
		}
		if err := cudadrv.MemsetD8(p, 0, n); err != nil {
			t.Fatal(err)
		}
	}
	clear(host)
	r := snapshotsOn(t, sock)
	defer r.Close()
	got, err := r.Latest()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if got.Step != 41 || got.Source != FromAgent {
		t.Fatalf("restored step %d from %q, want 41 from the agent", got.Step, got.Source)
	}
	if err := got.Into(state()...); err != nil {
		t.Fatal(err)
	}
	back1, back2 := make([]byte, big), make([]byte, small)
	if err := cudadrv.CopyFromDevice(back1, p1); err != nil {
		t.Fatal(err)
	}
	if err := cudadrv.CopyFromDevice(back2, p2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back1, want1) || !bytes.Equal(back2, want2) {
		t.Fatal("the device buffers restored differ from those saved")
	}
	for i := range host {
		if host[i] != wantHost[i] {
			t.Fatalf("host element %d restored as %v, saved %v", i, host[i], wantHost[i])
		}
	}
}
