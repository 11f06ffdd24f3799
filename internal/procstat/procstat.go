// Package procstat reads /proc/PID/stat, whose second field, the command
// name, is in parentheses and may contain anything (spaces, parentheses):
// the fields are split after its last ')'.
package procstat

import (
	"fmt"
	"os"
	"strings"
)

// Fields returns the fields of /proc/PID/stat after the command name:
// Fields(pid)[0] is field 3 (state), [1] field 4 (ppid) and so on; nil when
// it cannot be read.
func Fields(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	return Parse(string(b))
}

// Parse splits the text of a stat file after the command name.
func Parse(stat string) []string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(stat[i+1:])
}
