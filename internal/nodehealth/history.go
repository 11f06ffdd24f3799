package nodehealth

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteHistory prints the records for a person, oldest first, with the
// policy's decision for host at now and the count of skipped lines.
func WriteHistory(w io.Writer, path, host string, recs []Record, skipped int, now time.Time, p Policy) error {
	fmt.Fprintf(w, "node-health record of %s (%s)\n", host, path)
	if len(recs) == 0 {
		fmt.Fprintln(w, "no verdicts recorded: this machine has not failed a preflight check nor been lost from a job")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tHOST\tKIND\tCHECK\tDETAIL\tRUN")
		for _, r := range recs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.UTC().Format(time.RFC3339), r.Host, r.Kind, dash(r.Check), dash(r.Detail), dash(r.RunID))
		}
		tw.Flush()
	}
	if skipped > 0 {
		fmt.Fprintf(w, "%d line(s) of the file were not records and were skipped\n", skipped)
	}
	if d := Decide(recs, host, now, p); !d.Admit {
		fmt.Fprintln(w, d.Line)
	} else {
		fmt.Fprintf(w, "admitted to elastic jobs (kept out after %d failures within %s, for %s)\n", p.Failures, p.Window, p.CoolOff)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
