package worker

import "github.com/gotrain/gotrain/worker/ncclcomm"

// CommOption tunes a communicator that NewComm builds. Options of a backend
// the job does not use are ignored.
type CommOption func(*commOptions)

type commOptions struct {
	nccl ncclcomm.Tuning
}

// WithHighPriorityStream gives the NCCL backend's communication stream the
// device's greatest priority, so that its collectives (and the work
// DataParallel enqueues after them) take SMs ahead of the compute kernels
// running beside them. See ncclcomm.Tuning.
func WithHighPriorityStream() CommOption {
	return func(o *commOptions) { o.nccl.HighPriorityStream = true }
}

// WithNCCLCTAs bounds the CTAs each NCCL kernel uses (ncclConfig_t minCTAs
// and maxCTAs, NCCL 2.17 and newer); 0 leaves a bound to NCCL.
func WithNCCLCTAs(minCTAs, maxCTAs int) CommOption {
	return func(o *commOptions) { o.nccl.MinCTAs, o.nccl.MaxCTAs = minCTAs, maxCTAs }
}

// WithNCCLCTAPolicy sets the NCCL communicator's CTA policy
// (ncclConfig_t CTAPolicy, NCCL 2.27 and newer); see ncclcomm.Tuning.
func WithNCCLCTAPolicy(p ncclcomm.CTAPolicy) CommOption {
	return func(o *commOptions) { o.nccl.CTAPolicy = p }
}

func newCommOptions(opts []CommOption) commOptions {
	var o commOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}
