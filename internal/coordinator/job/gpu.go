package job

import "time"

// GPUSample is a rank's GPU as its agent last sampled it through NVML. The
// machine only keeps it, for Status; it decides nothing on it. Values NVML
// could not give are -1.
type GPUSample struct {
	// Index is the GPU's NVML index on the node.
	Index int
	UUID  string
	Name  string
	// Time is when the agent took the sample (its clock); zero: no sample.
	Time               time.Time
	UtilPercent        int
	MemoryUsed         uint64
	MemoryTotal        uint64
	PowerW             float64
	PowerLimitW        float64
	TempC              int
	SlowdownTempC      int
	SMClockMHz         int
	ThrottleReasons    uint64 // NVML's clock event reasons bit set
	XIDErrors, LastXID uint64
}
