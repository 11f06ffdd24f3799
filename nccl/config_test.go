package nccl

import (
	"math"
	"testing"
)

// TestConfigLayout pins the C struct to ncclConfig_t's layout in NCCL 2.28's
// nccl.h: NCCL reads it by offset, so a drift here would misconfigure NCCL.
func TestConfigLayout(t *testing.T) {
	cc, err := (&Config{}).toC()
	if err != nil {
		t.Fatal(err)
	}
	defer cc.free()
	l := cc.layout()
	if l.size != 80 || l.sizeofC != 80 {
		t.Errorf("size field %d, sizeof %d; want 80", l.size, l.sizeofC)
	}
	if l.magic != 0xcafebeef || l.version != 22800 {
		t.Errorf("magic %#x version %d; want 0xcafebeef 22800", l.magic, l.version)
	}
	if l.offNetName != 32 || l.offCommName != 48 || l.offLast != 76 {
		t.Errorf("offsets netName %d commName %d nvlinkCentricSched %d; want 32 48 76", l.offNetName, l.offCommName, l.offLast)
	}
	f := l.fields
	for name, v := range map[string]int32{"blocking": f.blocking, "minCTAs": f.minCTAs, "splitShare": f.splitShare, "nvlinkCentricSched": f.nvlinkCentricSched} {
		if v != math.MinInt32 {
			t.Errorf("zero Config: %s = %d, want NCCL_CONFIG_UNDEF_INT", name, v)
		}
	}
}

func TestConfigFields(t *testing.T) {
	cfg := &Config{NonBlocking: true, MinCTAs: Set(4), CGAClusterSize: Set(0), SplitShare: Set(1), NetName: "Socket", CommName: "dp", NVLinkCentricSched: Set(1)}
	cc, err := cfg.toC()
	if err != nil {
		t.Fatal(err)
	}
	defer cc.free()
	f := cc.layout().fields
	if f.blocking != 0 || f.minCTAs != 4 || f.cgaClusterSize != 0 || f.splitShare != 1 || f.nvlinkCentricSched != 1 {
		t.Errorf("fields = %+v", f)
	}
	if f.maxCTAs != math.MinInt32 {
		t.Errorf("unset MaxCTAs = %d", f.maxCTAs)
	}
	if f.netName != "Socket" || f.commName != "dp" {
		t.Errorf("strings: %q %q", f.netName, f.commName)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{{MinCTAs: Set(0)}, {MaxCTAs: Set(-1)}, {CGAClusterSize: Set(-2)}} {
		if _, err := cfg.toC(); err == nil {
			t.Errorf("%+v should not validate", cfg)
		}
	}
}
