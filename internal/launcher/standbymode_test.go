package launcher

import (
	"strings"
	"testing"
)

func TestParseStandbyMode(t *testing.T) {
	for in, want := range map[string]StandbyMode{"on": StandbyOn, "true": StandbyOn, "off": StandbyOff, "false": StandbyOff, "auto": StandbyAuto} {
		if got, err := ParseStandbyMode(in); err != nil || got != want {
			t.Errorf("ParseStandbyMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseStandbyMode("sometimes"); err == nil || !strings.Contains(err.Error(), "want on, off or auto") {
		t.Errorf("ParseStandbyMode(sometimes): %v", err)
	}
}
