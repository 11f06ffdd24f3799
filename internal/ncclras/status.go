package ncclras

import (
	"encoding/json"
	"fmt"
	"maps"
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
	var p textParser
	for _, line := range strings.Split(raw, "\n") {
		p.line(line)
	}
	st := &Status{Format: "text"}
	for _, c := range p.comms {
		st.Comms = append(st.Comms, c.finish())
	}
	return st
}

// textParser is ParseText's state: the communicators read so far, and where
// in a communicator's block the current line is.
type textParser struct {
	comms   []*textComm
	cur     *textComm  // the block's communicator; nil outside one
	kind    string     // the block's kind: MISMATCH, INCOMPLETE, ERROR
	fn      string     // MISMATCH: the function whose counts differ; "" in a status block
	group   *textGroup // MISMATCH: the group the next "Rank N -- ..." lines are in
	errKind string     // ERROR: "Initialization" or "Asynchronous"
	errText string     // ERROR: the error of the current group
}

// textComm is one communicator as the text report names it, possibly in
// several blocks.
type textComm struct {
	comm   Comm
	ranks  map[int]*Rank
	groups map[string][]*textGroup // by function
}

// line reads one line of the report.
func (p *textParser) line(line string) {
	t := strings.TrimSpace(line)
	if t == "" {
		return
	}
	if m := reCommHead.FindStringSubmatch(t); m != nil {
		p.commHead(m[1], m[2])
		return
	}
	if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
		p.cur = nil // a heading or a top-level block (DEAD, INCOMPLETE, TIMEOUT)
		return
	}
	if p.cur == nil {
		return
	}
	switch p.kind {
	case "MISMATCH":
		p.mismatchLine(t)
	case "INCOMPLETE":
		if m := reRankOnly.FindStringSubmatch(t); m != nil {
			p.rank(m[1], m[2]).Unresponsive = true
		}
	case "ERROR":
		p.errorLine(t)
	}
}

// commHead starts a block of communicator hash: "#0-0 (e029a0dad4bf726e)
// MISMATCH".
func (p *textParser) commHead(hash, kind string) {
	h, _ := normHash(hash)
	p.cur = nil
	for _, c := range p.comms {
		if c.comm.Hash == h {
			p.cur = c
		}
	}
	if p.cur == nil {
		p.cur = &textComm{comm: Comm{Hash: h}, ranks: map[int]*Rank{}, groups: map[string][]*textGroup{}}
		p.comms = append(p.comms, p.cur)
	}
	// INCOMPLETE,MISMATCH etc. are not printed as heads, but be lenient.
	kind, _, _ = strings.Cut(kind, ",")
	p.kind, p.fn, p.errKind, p.errText, p.group = kind, "", "", "", nil
}

// mismatchLine reads a line of a MISMATCH block: which function's counts
// differ, then its groups of ranks and the ranks named in them.
func (p *textParser) mismatchLine(t string) {
	if m := reDiffers.FindStringSubmatch(t); m != nil {
		p.fn, p.group = strings.ToLower(m[1]), nil
		return
	}
	if strings.HasPrefix(t, "Communicator ranks have different status") {
		p.fn, p.group = "", nil
		return
	}
	if p.fn == "" {
		return
	}
	if m := reGroup.FindStringSubmatch(t); m != nil {
		n, _ := strconv.Atoi(m[1])
		v, _ := strconv.ParseInt(m[2], 10, 64)
		p.group = &textGroup{count: n, value: v}
		p.cur.groups[p.fn] = append(p.cur.groups[p.fn], p.group)
		return
	}
	if m := reRankOps.FindStringSubmatch(t); m != nil {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		rk := p.rank(m[1], m[3])
		rk.Counts[p.fn] = v
		p.cur.groups[p.fn] = append(p.cur.groups[p.fn], &textGroup{count: 1, value: v, named: []int{rk.Rank}})
		p.group = nil
		return
	}
	if m := reRankOnly.FindStringSubmatch(t); m != nil && p.group != nil {
		rk := p.rank(m[1], m[2])
		rk.Counts[p.fn] = p.group.value
		p.group.named = append(p.group.named, rk.Rank)
	}
}

// errorLine reads a line of an ERROR block: the kind of errors, then groups
// of ranks that reported one error, or ranks with their own.
func (p *textParser) errorLine(t string) {
	if m := reErrKind.FindStringSubmatch(t); m != nil {
		p.errKind, p.errText = m[1], ""
		return
	}
	if m := reReported.FindStringSubmatch(t); m != nil {
		p.errText = m[2]
		return
	}
	var rk *Rank
	what := p.errText
	if m := reRankErr.FindStringSubmatch(t); m != nil {
		rk, what = p.rank(m[1], m[3]), m[2]
	} else if m := reRankOnly.FindStringSubmatch(t); m != nil && p.errText != "" {
		rk = p.rank(m[1], m[2])
	} else {
		return
	}
	if p.errKind == "Initialization" {
		what = "initialization: " + what
	}
	rk.Error = what
}

// rank returns rank r (decimal digits) of the current communicator, adding
// it, and records where it runs when where says: "GPU 0 (NVML 0) managed by
// process 579 on node 10.0.0.1".
func (p *textParser) rank(r, where string) *Rank {
	n, _ := strconv.Atoi(r)
	rk := p.cur.ranks[n]
	if rk == nil {
		rk = &Rank{Rank: n, Pid: -1, CudaDev: -1, NvmlDev: -1, Counts: map[string]int64{}}
		p.cur.ranks[n] = rk
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

// finish returns the communicator: its ranks in order, the missing ones
// apart, and the ranks the report does not name summed up in Others.
func (c *textComm) finish() Comm {
	out := c.comm
	for _, r := range slices.Sorted(maps.Keys(c.ranks)) {
		rk := *c.ranks[r]
		if rk.Unresponsive {
			rk.Counts = nil
			out.Missing = append(out.Missing, rk)
		} else {
			out.Ranks = append(out.Ranks, rk)
		}
	}
	responded, ok := c.others(&out)
	if responded > 0 && ok {
		out.Size = responded + len(out.Missing)
	}
	// A named rank that a function does not name is in its unnamed group.
	for i := range out.Ranks {
		for f, n := range out.Others {
			if _, named := out.Ranks[i].Counts[f]; !named {
				out.Ranks[i].Counts[f] = n
			}
		}
	}
	return out
}

// others sets out.Others and out.OthersCount from the ranks the report does
// not name: for each function, the one group with fewer named ranks than its
// count. Every function's groups add up to the ranks that answered: it
// returns how many, and false when the functions disagree (then Others is
// nil and OthersCount -1).
func (c *textComm) others(out *Comm) (responded int, ok bool) {
	ok = true
	fns := slices.Sorted(maps.Keys(c.groups))
	for i, f := range fns {
		total, unnamed, other, single := unnamedGroup(c.groups[f])
		ok = ok && single
		if i == 0 {
			responded, out.OthersCount = total, unnamed
		} else if total != responded || unnamed != out.OthersCount {
			ok = false
		}
		if other != nil {
			if out.Others == nil {
				out.Others = map[string]int64{}
			}
			out.Others[f] = other.value
		}
	}
	// Unnamed ranks, but some function names all its ranks: the unnamed
	// ones are named there; inconsistent, give up on them.
	if !ok || out.OthersCount > 0 && len(out.Others) < len(fns) {
		out.Others, out.OthersCount = nil, -1
	}
	return responded, ok
}

// unnamedGroup sums one function's groups: the ranks they count, how many
// of those the report does not name, and the group they are in; single is
// false when two groups have unnamed ranks (who is where?).
func unnamedGroup(gs []*textGroup) (total, unnamed int, other *textGroup, single bool) {
	single = true
	for _, g := range gs {
		total += g.count
		if len(g.named) < g.count {
			unnamed += g.count - len(g.named)
			single = single && other == nil
			other = g
		}
	}
	return total, unnamed, other, single
}
