package rhythm

import (
	"reflect"
	"testing"
)

// A field added to a learner without its field in the image would be lost
// by every coordinator replica restored from a snapshot.
func TestImageHasEveryField(t *testing.T) {
	for _, p := range []struct{ live, image any }{{Pace{}, PaceImage{}}, {Judge{}, JudgeImage{}}, {point{}, PointImage{}}} {
		lt, it := reflect.TypeOf(p.live), reflect.TypeOf(p.image)
		if lt.NumField() != it.NumField() {
			t.Errorf("%s has %d fields, its image %s %d: give the new field its place in the image", lt, lt.NumField(), it, it.NumField())
		}
	}
}
