package nccl

// Memory for NCCL's symmetric kernels. A buffer that every rank allocates
// with MemAlloc (cuMem, with the handle types NCCL shares between
// processes) and registers, collectively and at the same offsets, as a
// symmetric window lets NCCL 2.27 and newer run its symmetric-memory
// kernels on it: peers load and store each other's buffers directly over
// NVLink instead of staging through NCCL's FIFOs. NCCL only uses them with
// cuMem on (NCCL_CUMEM_ENABLE=1).

// Window is a registered buffer (ncclWindow_t).
type Window uintptr

// WinCollSymmetric is NCCL_WIN_COLL_SYMMETRIC: every rank uses the window
// at the same offsets.
const WinCollSymmetric = 0x01

// MemAlloc allocates bytes of device memory on the current device for NCCL
// (ncclMemAlloc, NCCL 2.19). Call it where the device's context is current.
func (l *Library) MemAlloc(bytes int) (uintptr, error) {
	if err := l.need("ncclMemAlloc"); err != nil {
		return 0, err
	}
	p, r := cMemAlloc(bytes)
	if r != Success {
		return 0, newError("ncclMemAlloc", r, 0)
	}
	return p, nil
}

// MemFree frees memory from MemAlloc (ncclMemFree).
func (l *Library) MemFree(p uintptr) error {
	if err := l.need("ncclMemFree"); err != nil {
		return err
	}
	if r := cMemFree(p); r != Success {
		return newError("ncclMemFree", r, 0)
	}
	return nil
}

// WindowRegister registers bytes at buf as a window of c
// (ncclCommWindowRegister, NCCL 2.27): a collective call, every rank with
// the same flags (WinCollSymmetric or 0).
func (c *Comm) WindowRegister(buf uintptr, bytes int, flags int) (Window, error) {
	if err := c.lib.need("ncclCommWindowRegister"); err != nil {
		return 0, err
	}
	h := c.h.Load()
	if h == 0 {
		return 0, ErrClosed
	}
	w, r := cWindowRegister(h, buf, bytes, flags)
	if r != Success {
		return 0, newError("ncclCommWindowRegister", r, h)
	}
	return Window(w), nil
}

// WindowDeregister undoes WindowRegister (ncclCommWindowDeregister), also
// collectively.
func (c *Comm) WindowDeregister(w Window) error {
	if err := c.lib.need("ncclCommWindowDeregister"); err != nil {
		return err
	}
	h := c.h.Load()
	if h == 0 {
		return ErrClosed
	}
	if r := cWindowDeregister(h, uintptr(w)); r != Success {
		return newError("ncclCommWindowDeregister", r, h)
	}
	return nil
}
