package cudadrv

import (
	"fmt"
	"sync"
)

// callSet is one group of driver entry points whose shim (kernel_shim.c,
// stream_shim.c, peer_shim.c) resolves them from the libcuda.so.1 that Load
// opened, the first time a call of the group is made.
type callSet struct {
	open   func(path string) string // the shim's open: "" or why it failed
	mu     sync.Mutex
	loaded bool
}

func (c *callSet) ensure() error {
	loadMu.Lock()
	d := loaded
	loadMu.Unlock()
	if d == nil {
		return ErrNotLoaded
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loaded {
		return nil
	}
	if msg := c.open(d.path); msg != "" {
		return fmt.Errorf("cudadrv: %s", msg)
	}
	c.loaded = true
	return nil
}
