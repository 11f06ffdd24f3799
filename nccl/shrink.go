package nccl

import (
	"context"
	"fmt"
)

// Recovery without a new communicator: after a rank dies, the survivors
// Revoke (or Shrink with ShrinkAbort) the communicator and Shrink it to
// themselves, which needs no new unique id and no rendezvous; a replacement
// joins with Grow. On an NCCL that predates these (Library.Has says), the
// way back is a new unique id and InitRank, as before.

// ShrinkMode is the shrinkFlags of ncclCommShrink.
type ShrinkMode int

const (
	// ShrinkDefault (NCCL_SHRINK_DEFAULT) shrinks a healthy, quiescent
	// communicator (or one that Revoke has made quiescent).
	ShrinkDefault ShrinkMode = 0
	// ShrinkAbort (NCCL_SHRINK_ABORT) first stops the parent's outstanding
	// work, such as a collective that waits for the dead rank. The parent
	// must then be aborted, never destroyed: Destroy on it aborts.
	ShrinkAbort ShrinkMode = 1
)

func (m ShrinkMode) String() string {
	switch m {
	case ShrinkDefault:
		return "default"
	case ShrinkAbort:
		return "abort"
	}
	return fmt.Sprintf("ShrinkMode(%d)", int(m))
}

// Revoke stops c's in-flight work and waits until c is quiescent
// (ncclCommRevoke, NCCL 2.29): every survivor of a failure calls it before
// Shrink, Split or Destroy. It is local, not collective. A revoked c can be
// shrunk, split, destroyed or aborted, not finalized, and shares no
// resources with what Shrink or Split make of it. ctx bounds the wait.
func (c *Comm) Revoke(ctx context.Context) error {
	if err := c.lib.need("ncclCommRevoke"); err != nil {
		return err
	}
	h := c.h.Load()
	if h == 0 {
		return ErrClosed
	}
	if r := cRevoke(h, 0); r != Success && r != InProgress {
		return newError("ncclCommRevoke", r, h)
	}
	c.revoked.Store(true)
	// The revoke's own job leaves its result as c's state, so a failure
	// from before the revoke does not show here.
	if err := c.Wait(ctx); err != nil {
		return fmt.Errorf("nccl: ncclCommRevoke: %w", err)
	}
	return nil
}

// Shrink makes a communicator of c's ranks without the ones in exclude,
// renumbered in order to fill the gaps (ncclCommShrink, NCCL 2.27). Every
// rank that stays calls it with the same list; the excluded ranks do not
// call it. A nil cfg inherits c's configuration. After a failure, Revoke c
// first and use ShrinkDefault, or use ShrinkAbort; in both cases abort c
// afterwards rather than destroy it.
func (c *Comm) Shrink(ctx context.Context, exclude []int, cfg *Config, mode ShrinkMode) (*Comm, error) {
	if err := c.lib.need("ncclCommShrink"); err != nil {
		return nil, err
	}
	if mode != ShrinkDefault && mode != ShrinkAbort {
		return nil, fmt.Errorf("nccl: Shrink: unknown mode %d; use ShrinkDefault or ShrinkAbort", int(mode))
	}
	h := c.h.Load()
	if h == 0 {
		return nil, ErrClosed
	}
	n, err := c.Count()
	if err != nil {
		return nil, err
	}
	self, err := c.UserRank()
	if err != nil {
		return nil, err
	}
	if err := checkExclude(exclude, n, self); err != nil {
		return nil, err
	}
	var cc *cConfig
	nonBlocking := c.nonBlocking
	if cfg != nil {
		if cc, err = cfg.toC(); err != nil {
			return nil, err
		}
		nonBlocking = cfg.NonBlocking
	}
	if mode == ShrinkAbort {
		c.abortOnly.Store(true)
	}
	sl := newSlot()
	r := cShrink(h, exclude, sl, cc, int(mode))
	return c.lib.finishInit(ctx, "ncclCommShrink", sl, r, cc, nonBlocking, c)
}

// checkExclude is Shrink's check of its list on a communicator of n ranks
// where this rank is self.
func checkExclude(exclude []int, n, self int) error {
	if len(exclude) == 0 {
		return fmt.Errorf("nccl: Shrink needs at least one rank to exclude; to keep every rank, use Split or the communicator itself")
	}
	if len(exclude) >= n {
		return fmt.Errorf("nccl: Shrink would exclude %d of %d ranks; at least one must stay", len(exclude), n)
	}
	seen := make(map[int]bool, len(exclude))
	for _, r := range exclude {
		switch {
		case r < 0 || r >= n:
			return fmt.Errorf("nccl: Shrink: rank %d to exclude is out of range (communicator of %d ranks)", r, n)
		case r == self:
			return fmt.Errorf("nccl: Shrink: rank %d excludes itself; an excluded rank must not call Shrink (abort its communicator instead)", r)
		case seen[r]:
			return fmt.Errorf("nccl: Shrink: rank %d is listed twice", r)
		}
		seen[r] = true
	}
	return nil
}

// GrowID returns the unique id that new ranks pass to JoinGrow
// (ncclCommGetUniqueId, NCCL 2.29). One existing rank, the grow's root,
// calls it, passes it to its own Grow and hands it to the new ranks; NCCL
// also sends it to c's first and last rank, which wait for it in their
// Grow. It cannot be called again until that grow is done.
func (c *Comm) GrowID() (UniqueID, error) {
	var id UniqueID
	if err := c.lib.need("ncclCommGetUniqueId"); err != nil {
		return id, err
	}
	h := c.h.Load()
	if h == 0 {
		return id, ErrClosed
	}
	if r := cCommGetUniqueID(h, &id); r != Success {
		return id, newError("ncclCommGetUniqueId", r, h)
	}
	return id, nil
}

// Grow makes a communicator of nranks ranks from c's ranks, which keep
// their numbers, and new ranks, which JoinGrow with the numbers from c's
// size up (ncclCommGrow, NCCL 2.29). Every rank of c calls it: the root
// with the id from its GrowID, the others with nil. A nil cfg inherits c's
// configuration. c stays usable; destroy or keep it as you need.
func (c *Comm) Grow(ctx context.Context, nranks int, rootID *UniqueID, cfg *Config) (*Comm, error) {
	if err := c.lib.need("ncclCommGrow"); err != nil {
		return nil, err
	}
	h := c.h.Load()
	if h == 0 {
		return nil, ErrClosed
	}
	n, err := c.Count()
	if err != nil {
		return nil, err
	}
	if nranks <= n {
		return nil, fmt.Errorf("nccl: Grow to %d ranks: the communicator has %d already; grow to more", nranks, n)
	}
	var cc *cConfig
	nonBlocking := c.nonBlocking
	if cfg != nil {
		if cc, err = cfg.toC(); err != nil {
			return nil, err
		}
		nonBlocking = cfg.NonBlocking
	}
	sl := newSlot()
	r := cGrow(h, nranks, rootID, -1, sl, cc)
	return c.lib.finishInit(ctx, "ncclCommGrow", sl, r, cc, nonBlocking, c)
}

// JoinGrow is Grow on a new rank: it joins, as rank, the communicator of
// nranks ranks that the existing ranks' Grow makes, with the id the root's
// GrowID gave (ncclCommGrow, NCCL 2.29). The calling thread's current CUDA
// context picks the GPU, as for InitRank. ctx and cfg as for InitRankConfig.
func (l *Library) JoinGrow(ctx context.Context, nranks int, id UniqueID, rank int, cfg *Config) (*Comm, error) {
	if err := l.need("ncclCommGrow"); err != nil {
		return nil, err
	}
	if err := checkRank(nranks, rank); err != nil {
		return nil, err
	}
	cc, err := cfg.toC()
	if err != nil {
		return nil, err
	}
	sl := newSlot()
	r := cGrow(0, nranks, &id, rank, sl, cc)
	return l.finishInit(ctx, "ncclCommGrow", sl, r, cc, cfg != nil && cfg.NonBlocking, nil)
}
