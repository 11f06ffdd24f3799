package nccl

import (
	"fmt"
	"math"
)

// Int is an optional integer setting of a Config. The zero Int leaves the
// choice to NCCL (its default, or its NCCL_* environment variable).
type Int struct {
	v   int32
	set bool
}

// Set returns an Int that sets v.
func Set(v int) Int { return Int{v: int32(v), set: true} }

// Value returns the value and whether it is set.
func (i Int) Value() (int, bool) { return int(i.v), i.set }

// undef is NCCL_CONFIG_UNDEF_INT: NCCL picks the value.
const undef = math.MinInt32

func (i Int) c() int32 {
	if !i.set {
		return undef
	}
	return i.v
}

// Config is what InitRankConfig, InitRankScalable and Split accept: an
// ncclConfig_t. The zero Config is a blocking communicator with every other
// setting left to NCCL. Settings that the loaded NCCL predates are ignored by
// it (NCCL resets fields newer than the version gotrain declares, and newer
// NCCLs leave fields gotrain does not know at their defaults).
type Config struct {
	// NonBlocking makes init, finalize, split and collectives return
	// InProgress instead of waiting; the caller then waits with Comm.Wait.
	// NCCL 2.14 and newer.
	NonBlocking bool
	// CGAClusterSize, MinCTAs and MaxCTAs: NCCL 2.17 and newer.
	CGAClusterSize Int
	MinCTAs        Int
	MaxCTAs        Int
	// NetName selects the network plugin or transport ("IB", "Socket"); "" for NCCL's choice.
	NetName string
	// SplitShare (1) lets communicators created by Split share resources with their parent. NCCL 2.18.
	SplitShare Int
	// TrafficClass is the network traffic class. NCCL 2.25.
	TrafficClass Int
	// CommName names the communicator in NCCL's logs and profiler; "" for none.
	CommName string
	// CollNetEnable (1) enables CollNet (SHARP). NCCL 2.27.
	CollNetEnable Int
	// CTAPolicy is a bitmask of NCCL_CTA_POLICY_* values. NCCL 2.27.
	CTAPolicy Int
	// ShrinkShare (1) lets a shrunk communicator share its parent's resources. NCCL 2.27.
	ShrinkShare Int
	// NVLSCTAs caps the CTAs of NVLS algorithms. NCCL 2.27.
	NVLSCTAs Int
	// NChannelsPerNetPeer and NVLinkCentricSched: NCCL 2.28.
	NChannelsPerNetPeer Int
	NVLinkCentricSched  Int
}

// configFields is a Config as the C struct's integers.
type configFields struct {
	blocking, cgaClusterSize, minCTAs, maxCTAs int32
	netName                                    string
	splitShare, trafficClass                   int32
	commName                                   string
	collnetEnable, ctaPolicy, shrinkShare      int32
	nvlsCTAs, nChannelsPerNetPeer              int32
	nvlinkCentricSched                         int32
}

// configLayout is what tests check of the C struct.
type configLayout struct {
	size, sizeofC, version           int
	magic                            uint32
	offNetName, offCommName, offLast int
	fields                           configFields
}

func (c *Config) validate() error {
	for _, f := range []struct {
		name string
		v    Int
		min  int
	}{{"CGAClusterSize", c.CGAClusterSize, 0}, {"MinCTAs", c.MinCTAs, 1}, {"MaxCTAs", c.MaxCTAs, 1}, {"NVLSCTAs", c.NVLSCTAs, 1}, {"NChannelsPerNetPeer", c.NChannelsPerNetPeer, 1}} {
		if v, ok := f.v.Value(); ok && v < f.min {
			return fmt.Errorf("nccl: Config.%s is %d, want at least %d", f.name, v, f.min)
		}
	}
	return nil
}

func (c *Config) fields() configFields {
	f := configFields{
		blocking:            undef,
		cgaClusterSize:      c.CGAClusterSize.c(),
		minCTAs:             c.MinCTAs.c(),
		maxCTAs:             c.MaxCTAs.c(),
		netName:             c.NetName,
		splitShare:          c.SplitShare.c(),
		trafficClass:        c.TrafficClass.c(),
		commName:            c.CommName,
		collnetEnable:       c.CollNetEnable.c(),
		ctaPolicy:           c.CTAPolicy.c(),
		shrinkShare:         c.ShrinkShare.c(),
		nvlsCTAs:            c.NVLSCTAs.c(),
		nChannelsPerNetPeer: c.NChannelsPerNetPeer.c(),
		nvlinkCentricSched:  c.NVLinkCentricSched.c(),
	}
	if c.NonBlocking {
		f.blocking = 0
	}
	return f
}

// toC returns the C struct for c; a nil c gives the zero Config's struct.
func (c *Config) toC() (*cConfig, error) {
	if c == nil {
		c = &Config{}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return newCConfig(c.fields()), nil
}
