package worker

import (
	"testing"

	"github.com/gotrain/gotrain/worker/ncclcomm"
)

func TestCommOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []CommOption
		want ncclcomm.Tuning
	}{
		{"none", nil, ncclcomm.Tuning{}},
		{"priority", []CommOption{WithHighPriorityStream()}, ncclcomm.Tuning{HighPriorityStream: true}},
		{"ctas", []CommOption{WithNCCLCTAs(0, 16)}, ncclcomm.Tuning{MaxCTAs: 16}},
		{"both", []CommOption{WithNCCLCTAs(2, 8), WithHighPriorityStream()}, ncclcomm.Tuning{HighPriorityStream: true, MinCTAs: 2, MaxCTAs: 8}},
		{"last wins", []CommOption{WithNCCLCTAs(2, 8), WithNCCLCTAs(0, 4)}, ncclcomm.Tuning{MaxCTAs: 4}},
	} {
		if got := newCommOptions(tc.opts).nccl; got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
