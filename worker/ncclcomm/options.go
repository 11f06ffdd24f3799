package ncclcomm

import (
	"fmt"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
)

// Tuning holds the performance settings of a communicator. The zero Tuning
// is NCCL's and CUDA's defaults: a stream of normal priority and as many
// CTAs as NCCL picks.
type Tuning struct {
	// HighPriorityStream creates the communicator's stream with the
	// greatest priority of the device (the numerically lowest of
	// cuCtxGetStreamPriorityRange): when its collectives (and the work
	// enqueued after them, such as a per-bucket optimizer) are launched
	// while a compute kernel fills the GPU, the scheduler gives them the
	// next free SMs instead of queueing them behind the compute kernel's
	// remaining blocks.
	HighPriorityStream bool
	// MinCTAs and MaxCTAs bound the CTAs (thread blocks, one per channel)
	// each NCCL kernel of the communicator uses: ncclConfig_t minCTAs and
	// maxCTAs, NCCL 2.17 and newer. Fewer CTAs leave more SMs to kernels
	// running beside the collectives, at some bandwidth. 0 leaves the
	// choice to NCCL (or its NCCL_MIN_CTAS / NCCL_MAX_CTAS variables).
	MinCTAs, MaxCTAs int
	// CTAPolicy is ncclConfig_t CTAPolicy (NCCL 2.27 and newer; older ones
	// ignore it): CTAPolicyEfficiency asks NCCL for the fewest CTAs that
	// still give decent bandwidth, for collectives that overlap compute;
	// CTAPolicyZero (2.28) for none where NCCL can use the copy engines.
	// CTAPolicyDefault leaves NCCL's.
	CTAPolicy CTAPolicy
}

// CTAPolicy is one of NCCL's NCCL_CTA_POLICY_* values.
type CTAPolicy int

// The NCCL_CTA_POLICY_* values of nccl.h.
const (
	CTAPolicyDefault    CTAPolicy = 0
	CTAPolicyEfficiency CTAPolicy = 1
	CTAPolicyZero       CTAPolicy = 2
)

// ParseCTAPolicy reads "default", "efficiency" or "zero".
func ParseCTAPolicy(s string) (CTAPolicy, error) {
	switch s {
	case "", "default":
		return CTAPolicyDefault, nil
	case "efficiency":
		return CTAPolicyEfficiency, nil
	case "zero":
		return CTAPolicyZero, nil
	}
	return 0, fmt.Errorf("NCCL CTA policy %q: want default, efficiency or zero", s)
}

func (p CTAPolicy) String() string {
	switch p {
	case CTAPolicyDefault:
		return "default"
	case CTAPolicyEfficiency:
		return "efficiency"
	case CTAPolicyZero:
		return "zero"
	}
	return fmt.Sprintf("CTAPolicy(%d)", int(p))
}

func (t Tuning) validate() error {
	switch {
	case t.MinCTAs < 0 || t.MaxCTAs < 0:
		return fmt.Errorf("ncclcomm: CTA limits min %d, max %d: want 0 (NCCL's choice) or more", t.MinCTAs, t.MaxCTAs)
	case t.MinCTAs > 0 && t.MaxCTAs > 0 && t.MinCTAs > t.MaxCTAs:
		return fmt.Errorf("ncclcomm: at least %d CTAs but at most %d: want min ≤ max", t.MinCTAs, t.MaxCTAs)
	case t.CTAPolicy < CTAPolicyDefault || t.CTAPolicy > CTAPolicyZero:
		return fmt.Errorf("ncclcomm: %v: want default, efficiency or zero", t.CTAPolicy)
	}
	return nil
}

// ncclConfig returns the NCCL configuration of the communicator that runs
// the collectives, named name.
func (t Tuning) ncclConfig(name string) *nccl.Config {
	cfg := &nccl.Config{CommName: name}
	if t.MinCTAs > 0 {
		cfg.MinCTAs = nccl.Set(t.MinCTAs)
	}
	if t.MaxCTAs > 0 {
		cfg.MaxCTAs = nccl.Set(t.MaxCTAs)
	}
	if t.CTAPolicy != CTAPolicyDefault {
		cfg.CTAPolicy = nccl.Set(int(t.CTAPolicy))
	}
	return cfg
}

// streamPriority returns the priority of the communicator's stream given the
// device's range (least: the default, greatest: the most urgent), and
// whether it differs from the default.
func (t Tuning) streamPriority(least, greatest int) (prio int, custom bool) {
	if !t.HighPriorityStream || least == greatest {
		return least, false
	}
	return greatest, true
}

// newStream creates the communicator's stream in the current context, with
// the priority t asks for.
func (t Tuning) newStream() (cudadrv.Stream, error) {
	if !t.HighPriorityStream {
		return cudadrv.NewStream(cudadrv.StreamNonBlocking)
	}
	least, greatest, err := cudadrv.StreamPriorityRange()
	if err != nil {
		return 0, err
	}
	p, custom := t.streamPriority(least, greatest)
	if !custom {
		return cudadrv.NewStream(cudadrv.StreamNonBlocking)
	}
	return cudadrv.NewStreamWithPriority(cudadrv.StreamNonBlocking, p)
}

// Tuning returns the communicator's tuning, as Config gave it.
func (c *Comm) Tuning() Tuning { return c.tuning }
