package worker

import (
	"fmt"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/memsnap"
)

// A snapshot's state may live on the GPU: Save copies device buffers into
// the shared memory it hands to the agent, and State.Into copies a
// restored state back, with the CUDA driver (dlopened, so a program without
// GPU buffers never needs it).

// statePart is one buffer of a state: host bytes, or n bytes at a device
// address.
type statePart struct {
	host []byte
	dev  uintptr
	n    int
}

func (p statePart) onDevice() bool { return p.host == nil && p.dev != 0 }

func partsOf(bufs []Buffer) []statePart {
	parts := make([]statePart, len(bufs))
	for i, b := range bufs {
		if b.OnDevice() {
			parts[i] = statePart{dev: b.DevicePointer(), n: b.Bytes()}
		} else {
			parts[i] = statePart{host: b.HostBytes(), n: b.Bytes()}
		}
	}
	return parts
}

func anyOnDevice(parts []statePart) bool {
	for _, p := range parts {
		if p.onDevice() {
			return true
		}
	}
	return false
}

// copyIn copies parts into bufs[idx]'s memory, buf. Before the first device
// copy into it the buffer is page-locked (once: ~40 ms per GiB), which makes
// the copies 3-4x faster (55 against 14-18 GB/s on an H200,
// bench/results/gpusnap-2026-12-02-s4.md); where that fails they run
// pageable.
func (s *Snapshots) copyIn(idx int, buf *memsnap.Buffer, parts []statePart) error {
	s.mu.Lock()
	locked := s.locked[idx]
	s.mu.Unlock()
	if anyOnDevice(parts) && !locked && buf.Size() > 0 {
		if err := cudadrv.HostRegister(buf.Bytes(), false); err == nil {
			s.mu.Lock()
			s.locked[idx] = true
			s.mu.Unlock()
		} else {
			s.log.Warn("the snapshot's shared memory could not be page-locked: device copies into it run pageable, slower", "err", err)
		}
	}
	dst := buf.Bytes()
	for i, p := range parts {
		if !p.onDevice() {
			n := memsnap.Copy(dst, p.host)
			dst = dst[n:]
			continue
		}
		if err := cudadrv.CopyFromDevice(dst[:p.n], cudadrv.DevicePtr(p.dev)); err != nil {
			return fmt.Errorf("copy buffer %d (%d bytes) from the device: %w", i, p.n, err)
		}
		dst = dst[p.n:]
	}
	return nil
}

// discard frees bufs[idx], page-locked or not.
func (s *Snapshots) discard(idx int) {
	s.mu.Lock()
	buf, locked := s.bufs[idx], s.locked[idx]
	s.bufs[idx], s.locked[idx] = nil, false
	s.mu.Unlock()
	if buf == nil {
		return
	}
	if locked {
		_ = cudadrv.HostUnregister(buf.Bytes())
	}
	buf.Discard()
}

// pageLockFrom is the restored state's size from which State.Into
// page-locks it before copying it to the device: the lock (~40 ms per GiB
// for a sealed snapshot) and a copy at 55 GB/s then beat a pageable copy at
// ~7 GB/s (bench/results/memstate-restore-2026-12-04.md).
const pageLockFrom = 64 << 20

// copyOut copies src, a restored state, into parts.
func copyOut(src []byte, parts []statePart) error {
	if anyOnDevice(parts) && len(src) >= pageLockFrom {
		if cudadrv.HostRegister(src, true) == nil {
			defer func() { _ = cudadrv.HostUnregister(src) }()
		}
	}
	for i, p := range parts {
		if !p.onDevice() {
			n := memsnap.Copy(p.host, src)
			src = src[n:]
			continue
		}
		if err := cudadrv.CopyToDevice(cudadrv.DevicePtr(p.dev), src[:p.n]); err != nil {
			return fmt.Errorf("worker: State.Into: copy buffer %d (%d bytes) to the device: %w", i, p.n, err)
		}
		src = src[p.n:]
	}
	return nil
}
