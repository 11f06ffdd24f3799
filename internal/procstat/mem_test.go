package procstat

import (
	"os"
	"testing"
)

func TestParseMemInfo(t *testing.T) {
	const text = "MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:    2000000 kB\nBuffers:  1 kB\n"
	avail, total, err := ParseMemInfo(text)
	if err != nil || avail != 2000000*1024 || total != 8000000*1024 {
		t.Errorf("ParseMemInfo = %d, %d, %v; want %d, %d", avail, total, err, 2000000*1024, 8000000*1024)
	}
	// Kernels before 3.14 have no MemAvailable: no estimate rather than MemFree.
	if _, _, err := ParseMemInfo("MemTotal: 8000000 kB\nMemFree: 100000 kB\n"); err == nil {
		t.Error("ParseMemInfo without MemAvailable: no error")
	}
	if _, _, err := ParseMemInfo("MemTotal: lots kB\nMemAvailable: 1 kB\n"); err == nil {
		t.Error("ParseMemInfo of a bad number: no error")
	}
}

func TestParseRSS(t *testing.T) {
	if n, err := ParseRSS("Name:\tpython3\nVmPeak:\t  999 kB\nVmRSS:\t  235520 kB\n"); err != nil || n != 235520*1024 {
		t.Errorf("ParseRSS = %d, %v; want %d", n, err, 235520*1024)
	}
	if _, err := ParseRSS("Name:\tzombie\nState:\tZ (zombie)\n"); err == nil {
		t.Error("ParseRSS without VmRSS: no error")
	}
}

// The real files: this process holds some memory, less than the machine
// has, and MemAvailable is at most MemTotal.
func TestMemOfThisProcess(t *testing.T) {
	avail, total, err := MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || avail > total {
		t.Errorf("MemInfo = available %d, total %d", avail, total)
	}
	rss, err := RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 || rss > total {
		t.Errorf("RSS(self) = %d bytes; want between 1 MiB and MemTotal (%d)", rss, total)
	}
	if _, err := RSS(0); err == nil {
		t.Error("RSS(0): no error")
	}
}
