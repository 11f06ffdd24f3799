package ncclcomm

import (
	"errors"
	"fmt"

	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
)

// AllocSymmetric allocates bytes of device memory with ncclMemAlloc and
// registers it as a symmetric window of the communicator (NCCL 2.27 and
// newer), for buffers the collectives work on in place, such as
// DataParallel's gradients: NCCL can then reduce them with its
// symmetric-memory kernels, peers loading and storing each other's buffer
// over NVLink, instead of staging them through its FIFOs. Registration is
// collective: every rank calls it with the same size at the same point, and
// free (deregister, then ncclMemFree) too. NCCL only uses symmetric kernels
// with cuMem on; the workers' default is NCCL_CUMEM_ENABLE=0 (env.go), so
// set NCCL_CUMEM_ENABLE=1 to use them.
func (c *Comm) AllocSymmetric(bytes int) (ptr uintptr, free func() error, err error) {
	var win nccl.Window
	err = c.Do(func() error {
		p, err := c.lib.MemAlloc(bytes)
		if err != nil {
			return err
		}
		w, err := c.nc.WindowRegister(p, bytes, nccl.WinCollSymmetric)
		if err != nil {
			_ = c.lib.MemFree(p)
			return err
		}
		ptr, win = p, w
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("ncclcomm: rank %d: symmetric buffer of %d bytes: %w", c.rank, bytes, err)
	}
	free = func() error {
		var derr error
		err := c.Do(func() error {
			derr = c.nc.WindowDeregister(win)
			return c.lib.MemFree(ptr)
		})
		if errors.Is(err, comm.ErrClosed) {
			return fmt.Errorf("ncclcomm: rank %d: free the symmetric buffer before closing its communicator: %w", c.rank, err)
		}
		return errors.Join(err, derr)
	}
	return ptr, free, nil
}
