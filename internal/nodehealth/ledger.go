package nodehealth

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/gotrain/gotrain/internal/runfile"
)

// Bounds of the file: it is read at every start, so it stays small.
const (
	// MaxRecords is how many records are kept: the oldest go first.
	MaxRecords = 256
	// maxText bounds a record's strings; maxLine a line of the file.
	maxText = 512
	maxLine = 4 << 10
	// maxFile bounds what is read of the file.
	maxFile = MaxRecords * maxLine
)

// FileName is the ledger's name in the state directory.
const FileName = "node-health.jsonl"

// DefaultPath is the ledger's path: $XDG_STATE_HOME/gotrain, else
// ~/.local/state/gotrain; "" when neither is known.
func DefaultPath(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "gotrain", FileName)
	}
	if h := getenv("HOME"); h != "" && filepath.IsAbs(h) {
		return filepath.Join(h, ".local", "state", "gotrain", FileName)
	}
	return ""
}

// Ledger is the file at a path.
type Ledger struct{ path string }

// Open returns the ledger at path (made on the first Append).
func Open(path string) *Ledger { return &Ledger{path: path} }

// Path is where the ledger lives.
func (l *Ledger) Path() string { return l.path }

// Read returns the records, oldest first, and how many lines were skipped
// because they were not records (garbled, out of bounds). A missing file
// is no records. A file that is not this user's private regular file is
// refused: another user could have planted it.
func (l *Ledger) Read() ([]Record, int, error) {
	f, err := os.OpenFile(l.path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read the node-health ledger %s: %w", l.path, err)
	}
	defer f.Close()
	if err := private(f); err != nil {
		return nil, 0, err
	}
	return parse(io.LimitReader(f, maxFile))
}

func private(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.Mode().IsRegular():
		return fmt.Errorf("the node-health ledger %s is not a regular file: remove it", f.Name())
	case sys != nil && int(sys.Uid) != os.Getuid():
		return fmt.Errorf("the node-health ledger %s belongs to uid %d, not to you: remove it (another user may have planted it)", f.Name(), sys.Uid)
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("the node-health ledger %s is open to other users (mode %#o): chmod 600 it, or remove it", f.Name(), st.Mode().Perm())
	}
	return nil
}

// parse reads records, one JSON object a line, skipping what is not one.
func parse(r io.Reader) ([]Record, int, error) {
	var recs []Record
	skipped := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, maxLine), maxLine)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var rec Record
		if json.Unmarshal(line, &rec) != nil || !ok(rec) {
			skipped++
			continue
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		// A line longer than any record: the rest cannot be trusted to
		// be split where it was written.
		return recs, skipped + 1, nil
	} else if err != nil {
		return recs, skipped, err
	}
	if len(recs) > MaxRecords {
		recs = recs[len(recs)-MaxRecords:]
	}
	return recs, skipped, nil
}

// ok says whether a parsed record is one: a known kind, a time, bounded
// printable text.
func ok(r Record) bool {
	if !r.Kind.Valid() || r.Time.IsZero() || r.Host == "" {
		return false
	}
	for _, s := range []string{r.Host, r.Check, r.Detail, r.RunID} {
		if len(s) > maxText || !utf8.ValidString(s) || strings.ContainsAny(s, "\n\r\x1b") {
			return false
		}
	}
	return true
}

// Append adds rec, keeping the file within MaxRecords: when it is full, the
// file is rewritten without the oldest records (atomically: a rename).
func (l *Ledger) Append(rec Record) error {
	rec = clean(rec)
	if !ok(rec) {
		return fmt.Errorf("nodehealth: record %+v is not valid", rec)
	}
	if err := runfile.PrivateDir(filepath.Dir(l.path)); err != nil {
		return err
	}
	// Agents of several jobs on one machine append at once: one at a time,
	// or a record read before another's rename is lost.
	lock, err := os.OpenFile(l.path+".lock", os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("lock the node-health ledger: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock the node-health ledger: %w", err)
	}
	recs, _, err := l.Read()
	if err != nil {
		return err
	}
	recs = append(recs, rec)
	if len(recs) > MaxRecords {
		recs = recs[len(recs)-MaxRecords:]
	}
	var buf bytes.Buffer
	for _, r := range recs {
		b, _ := json.Marshal(r)
		buf.Write(b)
		buf.WriteByte('\n')
	}
	tmp, err := os.CreateTemp(filepath.Dir(l.path), FileName+".*")
	if err != nil {
		return fmt.Errorf("write the node-health ledger: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("write the node-health ledger: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write the node-health ledger: %w", err)
	}
	return os.Rename(tmp.Name(), l.path) // CreateTemp made it 0600
}

// clean cuts a record's text to the bounds and makes it one line.
func clean(r Record) Record {
	cut := func(s string) string {
		s = strings.ToValidUTF8(strings.NewReplacer("\n", " ", "\r", " ", "\x1b", "").Replace(s), "")
		if len(s) > maxText {
			i := maxText - 3
			for i > 0 && !utf8.RuneStart(s[i]) {
				i--
			}
			s = s[:i] + "..."
		}
		return s
	}
	r.Host, r.Check, r.Detail, r.RunID = cut(r.Host), cut(r.Check), cut(r.Detail), cut(r.RunID)
	r.Time = r.Time.UTC().Round(0)
	return r
}
