package cpucomm

import "github.com/gotrain/gotrain/worker/comm"

var _ comm.Aborter = (*Comm)(nil)

// Abort is Close: it closes every connection without waiting for peers, so a
// collective in progress fails at once. It never blocks.
func (c *Comm) Abort() error { return c.Close() }
