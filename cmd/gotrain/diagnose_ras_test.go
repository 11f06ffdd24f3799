package main

import (
	"strings"
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestPrintViewNotes(t *testing.T) {
	var b strings.Builder
	printViewNotes(&b, []*gotrainv1.RankStatus{
		{Rank: 0, Progress: &gotrainv1.RankProgress{CommsSource: "nccl-ras"}},
		{Rank: 1, Progress: &gotrainv1.RankProgress{CommsNote: "not a gotrain worker and NCCL RAS unreachable at localhost:28028"}},
		{Rank: 2, Progress: &gotrainv1.RankProgress{Attached: true}},
		{Rank: 3},
	})
	want := "no collective-level view for rank 1: not a gotrain worker and NCCL RAS unreachable at localhost:28028\n" +
		"rank(s) 0: collectives from NCCL RAS (launch counts per function; no dtype or count)\n"
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
