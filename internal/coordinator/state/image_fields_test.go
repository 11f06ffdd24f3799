package state

import (
	"reflect"
	"testing"
)

// A table added to the state without its field in the image would be lost
// by every replica restored from a snapshot (see Image: how to add one).
// effects is not a table: it holds the entry being applied's effects.
func TestImageHasEveryTable(t *testing.T) {
	// Image encodes the outboxes in two fields more (Events, PlanEnded).
	if s, i := reflect.TypeOf(State{}).NumField()-1, reflect.TypeOf(Image{}).NumField()-2; s != i {
		t.Errorf("State has %d tables, Image %d: give the new table its field in Image, Image() and FromImage", s, i)
	}
}
