package torchhook

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// The program's timings (sitecustomize.py, part 3): DIR/PID.phases, JSON
// lines the rank's process appends to. Each line is a phase, with "phase"
// its name, "end" (and "start") unix nanoseconds, "seconds", and what the
// program added ("bytes", "source", "step"); or, once, "modules": the
// installed packages the program imported. The file is written by the
// program, so everything is checked: its size, each name, each number.

// PhasesSuffix ends the name of a process's timings file.
const PhasesSuffix = ".phases"

// Limits on what is read of a timings file: the hook writes at most 256
// lines and 300 module names.
const (
	maxFactsBytes = 256 << 10
	maxModules    = 300
)

// Fact is one phase the hook recorded.
type Fact struct {
	Phase      string
	Start, End time.Time
	Seconds    float64
	Bytes      int64
	Source     string
	Step       int64
}

// Facts is what one process's timings file holds.
type Facts struct {
	Phases []Fact
	// Modules are the installed packages the program had imported (top-level
	// names, in import order), nil until the hook wrote them.
	Modules []string
}

var (
	phaseName  = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)
	moduleName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,99}$`)
	sourceName = regexp.MustCompile(`^[a-z]{1,16}$`)
)

// PhasesPath is the timings file of process pid in the records directory.
func PhasesPath(dir string, pid int) string {
	return filepath.Join(dir, strconv.Itoa(pid)+PhasesSuffix)
}

// ReadFacts reads a process's timings file. A line that is not a valid
// record (cut short while written, or not the hook's) is skipped; a file
// that does not exist is an error satisfying os.IsNotExist.
func ReadFacts(path string) (Facts, error) {
	f, err := os.Open(path)
	if err != nil {
		return Facts{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFactsBytes))
	if err != nil {
		return Facts{}, fmt.Errorf("torchhook: read %s: %w", path, err)
	}
	return ParseFacts(b), nil
}

// ParseFacts reads timings from b; only whole, valid lines count.
func ParseFacts(b []byte) Facts {
	var out Facts
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxFactsBytes)
	for sc.Scan() {
		var rec struct {
			Phase   string    `json:"phase"`
			Start   int64     `json:"start"`
			End     int64     `json:"end"`
			Seconds float64   `json:"seconds"`
			Bytes   int64     `json:"bytes"`
			Source  string    `json:"source"`
			Step    int64     `json:"step"`
			Modules *[]string `json:"modules"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			continue
		}
		if rec.Modules != nil {
			if out.Modules == nil {
				out.Modules = validModules(*rec.Modules)
			}
			continue
		}
		if !phaseName.MatchString(rec.Phase) || rec.End <= 0 || rec.Start < 0 || rec.Start > rec.End ||
			rec.Seconds < 0 || rec.Seconds > 1e6 || rec.Bytes < 0 || rec.Step < 0 {
			continue
		}
		if rec.Source != "" && !sourceName.MatchString(rec.Source) {
			rec.Source = ""
		}
		fc := Fact{Phase: rec.Phase, End: time.Unix(0, rec.End), Seconds: rec.Seconds, Bytes: rec.Bytes, Source: rec.Source, Step: rec.Step}
		if rec.Start > 0 {
			fc.Start = time.Unix(0, rec.Start)
		}
		out.Phases = append(out.Phases, fc)
	}
	return out
}

// validModules keeps the names that are module names, at most maxModules,
// each once.
func validModules(names []string) []string {
	out := []string{}
	seen := map[string]bool{}
	for _, n := range names {
		if len(out) == maxModules {
			break
		}
		if moduleName.MatchString(n) && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
