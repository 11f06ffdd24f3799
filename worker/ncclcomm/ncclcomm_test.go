package ncclcomm

import (
	"strings"
	"testing"
)

func TestDeviceFor(t *testing.T) {
	for _, tc := range []struct {
		gpu     int
		visible string
		want    int
	}{
		{3, "3", 0}, {3, "", 3}, {-1, "", 0}, {1, "0,1", 1}, {2, "GPU-abc", 0},
		// gotrain launch lists the node's GPUs in local-rank order.
		{5, "4,5,7,6", 1}, {6, "4,5,7,6", 3}, {4, "4, 5", 0},
		{2, "4,5", 2}, // not in the list: the index itself
	} {
		got := DeviceFor(tc.gpu, func(k string) string {
			if k == "CUDA_VISIBLE_DEVICES" {
				return tc.visible
			}
			return ""
		})
		if got != tc.want {
			t.Errorf("DeviceFor(%d, CUDA_VISIBLE_DEVICES=%q) = %d, want %d", tc.gpu, tc.visible, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "x", Size: 0}, "size is 0"},
		{Config{Name: "x", Size: 2, Rank: 2}, "rank 2 is out of range"},
		{Config{Size: 1}, "needs a Name"},
		{Config{Name: "x", Size: 1, Device: -1}, "device is -1"},
		{Config{Name: "x", Size: 2, Rank: 1}, "Store is nil"},
	} {
		err := tc.cfg.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (&Config{Name: "x", Size: 1}).validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}
