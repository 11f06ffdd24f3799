package procstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MemInfo returns MemAvailable and MemTotal of /proc/meminfo, in bytes.
func MemInfo() (available, total uint64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	return ParseMemInfo(string(b))
}

// ParseMemInfo reads MemAvailable and MemTotal from the text of
// /proc/meminfo. Both must be there: MemAvailable is the kernel's own
// estimate of what can be allocated without swapping (free memory plus the
// reclaimable caches), which MemFree alone is not.
func ParseMemInfo(text string) (available, total uint64, err error) {
	var haveAvail, haveTotal bool
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "MemAvailable" && key != "MemTotal") {
			continue
		}
		n, err := parseKB(val)
		if err != nil {
			return 0, 0, fmt.Errorf("meminfo %s: %w", key, err)
		}
		if key == "MemAvailable" {
			available, haveAvail = n, true
		} else {
			total, haveTotal = n, true
		}
	}
	if !haveAvail || !haveTotal {
		return 0, 0, errors.New("meminfo: no MemAvailable or MemTotal")
	}
	return available, total, nil
}

// RSS returns the resident set size of process pid (VmRSS of
// /proc/PID/status), in bytes. A zombie has none: an error.
func RSS(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("rss: bad pid %d", pid)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return ParseRSS(string(b))
}

// ParseRSS reads VmRSS from the text of /proc/PID/status, in bytes.
func ParseRSS(status string) (uint64, error) {
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return parseKB(v)
		}
	}
	return 0, errors.New("status: no VmRSS")
}

// parseKB reads "  1234 kB", the unit /proc writes sizes in.
func parseKB(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("%q: want N kB", strings.TrimSpace(s))
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, err
	}
	return n * 1024, nil
}
