package benchrun

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Row is one size's result. Its JSON form is what `gotrain bench --json`
// prints, an array of rows; fields are only ever added.
type Row struct {
	Op      string  `json:"op"`
	Bytes   int64   `json:"bytes"`
	Count   int64   `json:"count"`
	Type    string  `json:"type"`
	RedOp   string  `json:"redop"` // "none" for all_gather and broadcast
	Root    int     `json:"root"`  // -1 unless broadcast
	TimeUs  float64 `json:"time_us"`
	AlgBW   float64 `json:"algbw_gbps"`
	BusBW   float64 `json:"busbw_gbps"`
	Wrong   int64   `json:"wrong"`
	Ranks   int     `json:"ranks"`
	Backend string  `json:"backend"`
}

// Report is what rank 0 hands back to `gotrain bench`.
type Report struct {
	Spec    Spec     `json:"spec"`
	Backend string   `json:"backend"`
	Ranks   int      `json:"ranks"`
	NCCL    string   `json:"nccl_version,omitempty"` // the NCCL the workers loaded
	Devices []string `json:"devices,omitempty"`      // rank 0's GPU, e.g. "NVIDIA H200"
	Rows    []Row    `json:"rows"`
}

// Wrong returns the number of wrong elements over every row.
func (r *Report) Wrong() int64 {
	var n int64
	for _, row := range r.Rows {
		n += row.Wrong
	}
	return n
}

// WriteJSON writes the rows as an indented JSON array.
func (r *Report) WriteJSON(w io.Writer) error {
	rows := r.Rows
	if rows == nil {
		rows = []Row{}
	}
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteTable writes the rows as nccl-tests does: a commented header, one
// line per size, and the average bus bandwidth.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# gotrain bench %s: %d ranks, backend %s", r.Spec.Op, r.Ranks, r.Backend)
	if r.NCCL != "" {
		fmt.Fprintf(&b, " (NCCL %s)", r.NCCL)
	}
	if len(r.Devices) > 0 {
		fmt.Fprintf(&b, ", %s", r.Devices[0])
	}
	fmt.Fprintf(&b, "\n# out-of-place, %d warm-up + %d timed iterations per size; time is the mean over ranks\n#\n", r.Spec.Warmup, r.Spec.Iters)
	fmt.Fprintf(&b, "# %10s %12s %8s %6s %5s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(&b, "# %10s %12s %8s %6s %5s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
	var sum float64
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "  %10d %12d %8s %6s %5d %10s %8.2f %8.2f %7d\n",
			row.Bytes, row.Count, row.Type, row.RedOp, row.Root, formatTime(row.TimeUs), row.AlgBW, row.BusBW, row.Wrong)
		sum += row.BusBW
	}
	if len(r.Rows) > 0 {
		fmt.Fprintf(&b, "# Out of bounds values : %d %s\n", r.Wrong(), okText(r.Wrong()))
		fmt.Fprintf(&b, "# Avg bus bandwidth    : %.4g\n", sum/float64(len(r.Rows)))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func okText(wrong int64) string {
	if wrong == 0 {
		return "OK"
	}
	return "WRONG"
}

// formatTime prints microseconds as nccl-tests does: more digits when small.
func formatTime(us float64) string {
	switch {
	case us < 100:
		return fmt.Sprintf("%.2f", us)
	case us < 10000:
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.0f", us)
}
