package ncclras

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Status is the communicator part of a RAS report: for each communicator,
// how many collectives of each kind every rank has launched, which ranks did
// not answer, and their errors.
//
// The JSON report (SET FORMAT json, NCCL 2.28 and later) lists every rank
// of every communicator. The text report lists a communicator only when
// something is wrong with it, and a rank only when it is an outlier; the
// ranks it does not name are summed up in Comm.Others.
type Status struct {
	// Format is "json" or "text".
	Format string
	Comms  []Comm
}

// Comm is one communicator as RAS reports it.
type Comm struct {
	// Hash is NCCL's communicator hash, 16 lower-case hex digits (what the
	// text report prints and NCCL's logs call commHash).
	Hash string
	// Size is the number of ranks in the communicator; 0 when the report
	// does not say.
	Size int
	// Ranks are the ranks RAS has data for; the text report names only
	// outliers.
	Ranks []Rank
	// Missing are the ranks RAS got no data from (unresponsive or dead
	// processes, or processes that left the communicator).
	Missing []Rank
	// Others (text report only) is what the ranks the report does not name
	// launched, per function: the majority's counts. Nil when every rank is
	// named, or when the report is ambiguous about them.
	Others map[string]int64
	// OthersCount is how many ranks Others stands for.
	OthersCount int
}

// Rank is one rank of a communicator.
type Rank struct {
	Rank int
	Host string // the node's address as NCCL knows it; "" when unknown
	Pid  int    // -1 when unknown
	// CudaDev is the GPU as the process sees it, NvmlDev its NVML index on
	// the node; -1 when unknown.
	CudaDev, NvmlDev int
	// Counts is how many collectives of each function the rank launched,
	// by lower-case function name ("allreduce", "allgather", "broadcast",
	// "reduce", "reducescatter"). In the text report only the functions
	// whose counts differ between ranks appear.
	Counts map[string]int64
	// Error is an asynchronous (or initialization) error NCCL reports for
	// the rank; "" when none.
	Error string
	// Aborted: the rank's communicator was aborted.
	Aborted bool
	// Unresponsive and Dead describe a missing rank.
	Unresponsive, Dead bool
}

// ParseStatus parses a report in the given format ("json" or "text").
func ParseStatus(format, raw string) (*Status, error) {
	if strings.EqualFold(format, "json") {
		return ParseJSON([]byte(raw))
	}
	return ParseText(raw), nil
}

// jsonReport is the JSON report's schema (NCCL src/ras/client_support.cc).
type jsonReport struct {
	NCCLVersion string `json:"nccl_version"`
	Comms       []struct {
		Hash    string     `json:"hash"`
		Size    int        `json:"size"`
		Ranks   []jsonRank `json:"ranks"`
		Missing []jsonRank `json:"missing_ranks"`
	} `json:"communicators"`
}

type jsonRank struct {
	Rank    int    `json:"rank"`
	Host    string `json:"host"`
	Pid     int    `json:"pid"`
	CudaDev int    `json:"cuda_dev"`
	NvmlDev int    `json:"nvml_dev"`
	Status  struct {
		InitState      int  `json:"init_state"`
		AsyncError     int  `json:"async_error"`
		AbortFlag      bool `json:"abort_flag"`
		Unresponsive   bool `json:"unresponsive"`
		ConsideredDead bool `json:"considered_dead"`
	} `json:"status"`
	Counts map[string]int64 `json:"collective_counts"`
}

// ncclResult names ncclResult_t values.
var ncclResult = []string{"success", "unhandled CUDA error", "system error", "internal error",
	"invalid argument", "invalid usage", "remote process error", "in progress"}

// resultError says what a non-zero ncclResult_t means; "" for success and
// in-progress.
func resultError(code int) string {
	if code == 0 || code == 7 {
		return ""
	}
	if code > 0 && code < len(ncclResult) {
		return fmt.Sprintf("NCCL error %d (%s)", code, ncclResult[code])
	}
	return fmt.Sprintf("NCCL error %d", code)
}

// ParseJSON parses a JSON report.
func ParseJSON(raw []byte) (*Status, error) {
	var r jsonReport
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: the JSON report does not parse: %w", ErrProtocol, err)
	}
	st := &Status{Format: "json"}
	for _, c := range r.Comms {
		h, ok := normHash(c.Hash)
		if !ok {
			return nil, fmt.Errorf("%w: communicator hash %q", ErrProtocol, c.Hash)
		}
		out := Comm{Hash: h, Size: c.Size}
		for _, jr := range c.Ranks {
			rk := fromJSON(jr)
			rk.Counts = map[string]int64{}
			for f, n := range jr.Counts {
				rk.Counts[strings.ToLower(f)] = n
			}
			if e := resultError(jr.Status.InitState); e != "" {
				rk.Error = "initialization: " + e
			}
			if e := resultError(jr.Status.AsyncError); e != "" {
				rk.Error = e
			}
			rk.Aborted = jr.Status.AbortFlag
			out.Ranks = append(out.Ranks, rk)
		}
		for _, jr := range c.Missing {
			rk := fromJSON(jr)
			rk.Unresponsive, rk.Dead = jr.Status.Unresponsive, jr.Status.ConsideredDead
			out.Missing = append(out.Missing, rk)
		}
		st.Comms = append(st.Comms, out)
	}
	return st, nil
}

func fromJSON(jr jsonRank) Rank {
	host := jr.Host
	if host == "unknown" {
		host = ""
	}
	return Rank{Rank: jr.Rank, Host: host, Pid: jr.Pid, CudaDev: jr.CudaDev, NvmlDev: jr.NvmlDev}
}

// normHash writes a communicator hash ("0x1f", "e029a0dad4bf726e") as 16
// lower-case hex digits.
func normHash(s string) (string, bool) {
	s = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "0x"), "0X")
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%016x", v), true
}

// The text report's lines that matter here.
var (
	reCommHead = regexp.MustCompile(`^#\d+-\d+ \(([0-9a-fA-F]+)\) ([A-Z,]+)$`)
	reDiffers  = regexp.MustCompile(`^Communicator ranks have different (\S+) operation counts$`)
	reGroup    = regexp.MustCompile(`^(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)$`)
	reRankOps  = regexp.MustCompile(`^Rank (\d+) has (?:launched up to operation (\d+)|not launched any operations)(?: -- (.*))?$`)
	reRankErr  = regexp.MustCompile(`^Rank (\d+) reported (.+?) -- (.*)$`)
	reRankOnly = regexp.MustCompile(`^Rank (\d+) -- (.*)$`)
	reWhere    = regexp.MustCompile(`^GPU (-?\d+)(?: \(NVML (-?\d+)\))? managed by process (-?\d+) on node (\S*)$`)
	reReported = regexp.MustCompile(`^(\d+) ranks reported (.+)$`)
	reErrKind  = regexp.MustCompile(`^(Initialization|Asynchronous) errors? on \d+ ranks?$`)
)

// textGroup is one "N ranks have launched up to operation M" group of a
// function, with the ranks the report names in it.
type textGroup struct {
	count int
	value int64
	named []int
}

// ParseText parses a text report. It never fails: what it does not
// recognize it skips.
func ParseText(raw string) *Status {
	st := &Status{Format: "text"}
	type commAcc struct {
		comm   *Comm
		ranks  map[int]*Rank
		groups map[string][]*textGroup
	}
	var accs []*commAcc
	var cur *commAcc
	kind := ""    // the block's kind: MISMATCH, INCOMPLETE, ERROR
	fn := ""      // MISMATCH: the function whose counts differ; "" in a status block
	errKind := "" // ERROR: "Initialization" or "Asynchronous"
	errText := "" // ERROR: the error of the current group
	var group *textGroup
	rankOf := func(r int, where string) *Rank {
		rk := cur.ranks[r]
		if rk == nil {
			rk = &Rank{Rank: r, Pid: -1, CudaDev: -1, NvmlDev: -1, Counts: map[string]int64{}}
			cur.ranks[r] = rk
		}
		if m := reWhere.FindStringSubmatch(strings.TrimSpace(where)); m != nil {
			rk.CudaDev, _ = strconv.Atoi(m[1])
			rk.NvmlDev = rk.CudaDev
			if m[2] != "" {
				rk.NvmlDev, _ = strconv.Atoi(m[2])
			}
			rk.Pid, _ = strconv.Atoi(m[3])
			rk.Host = m[4]
		}
		return rk
	}
	for _, line := range strings.Split(raw, "\n") {
		t := strings.TrimSpace(line)
		if t == "" {
			continue
		}
		if m := reCommHead.FindStringSubmatch(t); m != nil {
			h, _ := normHash(m[1])
			cur = nil
			for _, a := range accs {
				if a.comm.Hash == h {
					cur = a
				}
			}
			if cur == nil {
				cur = &commAcc{comm: &Comm{Hash: h}, ranks: map[int]*Rank{}, groups: map[string][]*textGroup{}}
				accs = append(accs, cur)
			}
			kind, fn, errKind, errText, group = m[2], "", "", "", nil
			if strings.Contains(kind, ",") { // INCOMPLETE,MISMATCH etc. are not printed as heads, but be lenient
				kind = strings.Split(kind, ",")[0]
			}
			continue
		}
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
			cur = nil // a heading or a top-level block (DEAD, INCOMPLETE, TIMEOUT)
			continue
		}
		if cur == nil {
			continue
		}
		switch kind {
		case "MISMATCH":
			if m := reDiffers.FindStringSubmatch(t); m != nil {
				fn, group = strings.ToLower(m[1]), nil
				continue
			}
			if strings.HasPrefix(t, "Communicator ranks have different status") {
				fn, group = "", nil
				continue
			}
			if fn == "" {
				continue
			}
			if m := reGroup.FindStringSubmatch(t); m != nil {
				n, _ := strconv.Atoi(m[1])
				v, _ := strconv.ParseInt(m[2], 10, 64)
				group = &textGroup{count: n, value: v}
				cur.groups[fn] = append(cur.groups[fn], group)
				continue
			}
			if m := reRankOps.FindStringSubmatch(t); m != nil {
				r, _ := strconv.Atoi(m[1])
				v, _ := strconv.ParseInt(m[2], 10, 64)
				rk := rankOf(r, m[3])
				rk.Counts[fn] = v
				cur.groups[fn] = append(cur.groups[fn], &textGroup{count: 1, value: v, named: []int{r}})
				group = nil
				continue
			}
			if m := reRankOnly.FindStringSubmatch(t); m != nil && group != nil {
				r, _ := strconv.Atoi(m[1])
				rk := rankOf(r, m[2])
				rk.Counts[fn] = group.value
				group.named = append(group.named, r)
			}
		case "INCOMPLETE":
			if m := reRankOnly.FindStringSubmatch(t); m != nil {
				r, _ := strconv.Atoi(m[1])
				rk := rankOf(r, m[2])
				rk.Unresponsive = true
			}
		case "ERROR":
			if m := reErrKind.FindStringSubmatch(t); m != nil {
				errKind, errText = m[1], ""
				continue
			}
			if m := reReported.FindStringSubmatch(t); m != nil {
				errText = m[2]
				continue
			}
			what := ""
			var r int
			var where string
			if m := reRankErr.FindStringSubmatch(t); m != nil {
				r, _ = strconv.Atoi(m[1])
				what, where = m[2], m[3]
			} else if m := reRankOnly.FindStringSubmatch(t); m != nil && errText != "" {
				r, _ = strconv.Atoi(m[1])
				what, where = errText, m[2]
			} else {
				continue
			}
			rk := rankOf(r, where)
			if errKind == "Initialization" {
				what = "initialization: " + what
			}
			rk.Error = what
		}
	}
	for _, a := range accs {
		c := a.comm
		var missing, present []int
		for r, rk := range a.ranks {
			if rk.Unresponsive {
				missing = append(missing, r)
			} else {
				present = append(present, r)
			}
		}
		slices.Sort(missing)
		slices.Sort(present)
		for _, r := range present {
			c.Ranks = append(c.Ranks, *a.ranks[r])
		}
		for _, r := range missing {
			rk := *a.ranks[r]
			rk.Counts = nil
			c.Missing = append(c.Missing, rk)
		}
		// The ranks the report does not name: for each function, the one
		// group with fewer named ranks than its count. Every function's
		// groups add up to the ranks that answered.
		responded := 0
		ok := true
		fns := make([]string, 0, len(a.groups))
		for f := range a.groups {
			fns = append(fns, f)
		}
		slices.Sort(fns)
		for i, f := range fns {
			total, unnamed := 0, 0
			var other *textGroup
			for _, g := range a.groups[f] {
				total += g.count
				if len(g.named) < g.count {
					unnamed += g.count - len(g.named)
					if other != nil {
						ok = false // two groups with unnamed ranks: who is where?
					}
					other = g
				}
			}
			if i == 0 {
				responded = total
				c.OthersCount = unnamed
			} else if total != responded || unnamed != c.OthersCount {
				ok = false
			}
			if other != nil {
				if c.Others == nil {
					c.Others = map[string]int64{}
				}
				c.Others[f] = other.value
			}
		}
		if !ok {
			c.Others, c.OthersCount = nil, -1
		}
		if c.OthersCount > 0 && len(c.Others) < len(fns) {
			// Unnamed ranks, but some function names all its ranks: the
			// unnamed ones are named there; inconsistent, give up on them.
			c.Others, c.OthersCount = nil, -1
		}
		if responded > 0 && ok {
			c.Size = responded + len(missing)
		}
		// A named rank that a function does not name is in its unnamed
		// group.
		for i := range c.Ranks {
			for f, n := range c.Others {
				if _, ok := c.Ranks[i].Counts[f]; !ok {
					c.Ranks[i].Counts[f] = n
				}
			}
		}
		st.Comms = append(st.Comms, *c)
	}
	return st
}
