package job

import (
	"reflect"
	"testing"
)

// A field added to the machine (or to a type it holds) without its field
// in the image would be lost by every replica restored from a snapshot:
// each type and its image have as many fields. (The transcripts, run on
// machines restored after every command, catch a field copied wrong.)
func TestImageHasEveryField(t *testing.T) {
	for _, p := range []struct{ live, image any }{
		{Machine{}, Image{}}, {node{}, NodeImage{}}, {rank{}, RankImage{}}, {hangState{}, HangImage{}},
		{commWatch{}, CommWatchImage{}}, {repeats{}, RepeatsImage{}}, {failureSignature{}, SignatureImage{}},
		{membership{}, MembersImage{}}, {straggle{}, StraggleImage{}}, {replacement{}, ReplacementImage{}},
		{barrier{}, map[int][]uint64{}},
	} {
		lt, it := reflect.TypeOf(p.live), reflect.TypeOf(p.image)
		want := 1 // a barrier is its one map
		if it.Kind() == reflect.Struct {
			want = it.NumField()
		}
		if lt.NumField() != want {
			t.Errorf("%s has %d fields, its image %s %d: give the new field its place in the image, Image and FromImage", lt, lt.NumField(), it, want)
		}
	}
}
