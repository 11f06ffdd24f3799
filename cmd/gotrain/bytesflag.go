package main

import (
	"fmt"
	"strconv"
	"strings"
)

// bytesFlag is a size in bytes given as N, N KiB/MiB/GiB/TiB or N KB/MB/GB/TB
// (decimal), e.g. --snapshot-memory 64GiB.
type bytesFlag struct{ n *int64 }

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
}

func (f bytesFlag) String() string {
	if f.n == nil || *f.n == 0 {
		return "0"
	}
	return strconv.FormatInt(*f.n, 10)
}

func (f bytesFlag) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*f.n = n
	return nil
}

// parseBytes reads a size such as 512MiB, 64GiB, 2.5GB or 1048576.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("give a size such as 64GiB, 512MiB or a number of bytes, not %q", s)
	}
	return int64(v * float64(mult)), nil
}
