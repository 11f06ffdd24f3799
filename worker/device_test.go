package worker

import (
	"strings"
	"testing"
)

// A rank's GPU is used where CUDA_VISIBLE_DEVICES shows it; one it hides
// is an error, and no GPU at all is the local rank's device with a warning.
func TestRankDevice(t *testing.T) {
	for _, tc := range []struct {
		name            string
		local, gpu      int
		visible         string
		want            int
		wantErr, warned string
	}{
		{name: "in the list", local: 1, gpu: 5, visible: "4,5", want: 1},
		{name: "alone", local: 0, gpu: 3, visible: "3", want: 0},
		{name: "no list", local: 1, gpu: 2, want: 2},
		{name: "hidden", local: 1, gpu: 6, visible: "4,5", wantErr: "its GPU 6 (GOTRAIN_GPU) is not in CUDA_VISIBLE_DEVICES=4,5"},
		{name: "UUIDs", local: 0, gpu: 1, visible: "GPU-a,GPU-b", want: 1},
		{name: "none assigned", local: 3, gpu: -1, want: 3, warned: "using CUDA device 3, its local rank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var warned string
			dev, err := rankDevice(tc.local, tc.gpu, func(k string) string {
				if k == "CUDA_VISIBLE_DEVICES" {
					return tc.visible
				}
				return ""
			}, func(m string) { warned = m })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || dev != tc.want || !strings.Contains(warned, tc.warned) || (tc.warned == "") != (warned == "") {
				t.Errorf("device %d, err %v, warned %q; want %d, warned %q", dev, err, warned, tc.want, tc.warned)
			}
		})
	}
}
