// Package checkpoint saves and loads a training program's state atomically,
// so that a job restarted after a failure resumes where it left off.
//
// A checkpoint is one file, ckpt-<step>.gtck, in a directory that every rank
// can read (on one node: any local directory; on several: a shared file
// system). Save writes a temporary file in the same directory, fsyncs it,
// renames it into place and fsyncs the directory, so a crash leaves either the
// old set of checkpoints or the new one, never a partial file under a final
// name. Each file starts with a header (magic, version, step, payload length,
// CRC-32C of the payload, CRC-32C of the header); Load checks all of it and
// skips a file that is torn, truncated or corrupt, falling back to the next
// newest. Save keeps the newest Keep checkpoints and removes older ones.
//
// Only files that pass every check count against Keep: a corrupt file, or one
// whose name claims a newer step than it holds, is never a reason to remove a
// good checkpoint, and Save never removes the file it has just written nor the
// newest valid one. Pruning removes only files older than the Keep-th newest
// valid checkpoint, after the new one is durable under its final name, so a
// reader that finds a file gone (removed between its listing and its open)
// lists again and finds a newer one. Files that are not regular files (a FIFO,
// a device) are skipped without being opened for a blocking read, and a file's
// header and size are checked before its state is read.
//
// In a data-parallel job every rank holds the same state: rank 0 saves, and
// every rank loads (then, to be safe, the state is broadcast from rank 0).
//
// # Usage
//
//	cp := checkpoint.Dir{Path: dir, Keep: 3}
//	step, state, err := cp.Latest()
//	switch {
//	case errors.Is(err, checkpoint.ErrNone): // a fresh start
//	case err != nil: return err
//	default: restore(state); start from step
//	}
//	...
//	if rank == 0 { err = cp.Save(step, encode()) }
package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Errors of the package.
var (
	// ErrNone: the directory holds no valid checkpoint.
	ErrNone = errors.New("checkpoint: no valid checkpoint")
	// ErrCorrupt: a file is not a complete, intact checkpoint.
	ErrCorrupt = errors.New("checkpoint: corrupt checkpoint")
)

const (
	magic      = "GTCKPT\x00\x01"
	version    = 1
	headerSize = 8 + 4 + 4 + 8 + 8 + 4 + 4
	prefix     = "ckpt-"
	suffix     = ".gtck"
	// DefaultKeep is how many checkpoints Save keeps when Dir.Keep is 0.
	DefaultKeep = 3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Dir is a directory of checkpoints.
type Dir struct {
	// Path is the directory; Save creates it.
	Path string
	// Keep is how many of the newest checkpoints Save keeps (default
	// DefaultKeep; at least 1).
	Keep int
}

// Name returns the file name of the checkpoint of step.
func Name(step int64) string { return fmt.Sprintf("%s%020d%s", prefix, step, suffix) }

// Save writes state as the checkpoint of step (a monotonic counter chosen by
// the caller, such as the global training step), atomically and durably, then
// removes all but the newest Keep checkpoints.
func (d Dir) Save(step int64, state []byte) error {
	if step < 0 {
		return fmt.Errorf("checkpoint: step %d is negative", step)
	}
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		return fmt.Errorf("checkpoint: create %s: %w", d.Path, err)
	}
	final := filepath.Join(d.Path, Name(step))
	f, err := os.CreateTemp(d.Path, ".tmp-"+Name(step)+"-*")
	if err != nil {
		return fmt.Errorf("checkpoint: save step %d: %w", step, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly after the rename
	hdr := encodeHeader(step, state)
	_, err = f.Write(hdr)
	if err == nil {
		_, err = f.Write(state)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("checkpoint: save step %d: %w", step, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("checkpoint: save step %d: %w", step, err)
	}
	if err := syncDir(d.Path); err != nil {
		return fmt.Errorf("checkpoint: save step %d: sync %s: %w", step, d.Path, err)
	}
	return d.prune(step)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func encodeHeader(step int64, state []byte) []byte {
	h := make([]byte, 0, headerSize)
	h = append(h, magic...)
	h = binary.LittleEndian.AppendUint32(h, version)
	h = binary.LittleEndian.AppendUint32(h, 0) // flags
	h = binary.LittleEndian.AppendUint64(h, uint64(step))
	h = binary.LittleEndian.AppendUint64(h, uint64(len(state)))
	h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(state, castagnoli))
	return binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
}

// Decode checks a whole checkpoint file's bytes and returns its step and state.
func Decode(b []byte) (step int64, state []byte, err error) {
	step, n, err := decodeHeader(b)
	if err != nil {
		return 0, nil, err
	}
	if n != uint64(len(b)-headerSize) {
		return 0, nil, fmt.Errorf("%w: the header says %d bytes of state, the file holds %d (torn write?)", ErrCorrupt, n, len(b)-headerSize)
	}
	state = b[headerSize:]
	if err := checkState(b[:headerSize], state); err != nil {
		return 0, nil, err
	}
	return step, state, nil
}

// decodeHeader checks the header at the start of b and returns the step and
// the length of the state it announces.
func decodeHeader(b []byte) (step int64, n uint64, err error) {
	if len(b) < headerSize {
		return 0, 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCorrupt, len(b), headerSize)
	}
	h := b[:headerSize]
	if string(h[:8]) != magic {
		return 0, 0, fmt.Errorf("%w: bad magic %q", ErrCorrupt, h[:8])
	}
	if got, want := binary.LittleEndian.Uint32(h[36:]), crc32.Checksum(h[:36], castagnoli); got != want {
		return 0, 0, fmt.Errorf("%w: header checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != version {
		return 0, 0, fmt.Errorf("%w: version %d, this program reads version %d", ErrCorrupt, v, version)
	}
	step = int64(binary.LittleEndian.Uint64(h[16:]))
	if step < 0 {
		return 0, 0, fmt.Errorf("%w: negative step %d", ErrCorrupt, step)
	}
	return step, binary.LittleEndian.Uint64(h[24:]), nil
}

func checkState(h, state []byte) error {
	if got, want := crc32.Checksum(state, castagnoli), binary.LittleEndian.Uint32(h[32:]); got != want {
		return fmt.Errorf("%w: state checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	return nil
}

// errNotRegular: a file named like a checkpoint is not a regular file.
var errNotRegular = errors.New("not a regular file")

// Load reads and checks one checkpoint file. It opens the file without
// blocking (a FIFO named like a checkpoint is refused, not waited on) and
// checks the header against the file's size before it reads the state.
func Load(file string) (step int64, state []byte, err error) {
	f, err := openNonBlocking(file)
	if err != nil {
		return 0, nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return 0, nil, fmt.Errorf("%s: %w: %w (%s)", file, ErrCorrupt, errNotRegular, fi.Mode().Type())
	}
	var h [headerSize]byte
	if _, err := io.ReadFull(f, h[:]); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, nil, fmt.Errorf("%s: %w: %d bytes, shorter than the %d-byte header", file, ErrCorrupt, fi.Size(), headerSize)
	} else if err != nil {
		return 0, nil, fmt.Errorf("checkpoint: read %s: %w", file, err)
	}
	step, n, err := decodeHeader(h[:])
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", file, err)
	}
	if n != uint64(fi.Size()-headerSize) {
		return 0, nil, fmt.Errorf("%s: %w: the header says %d bytes of state, the file holds %d (torn write?)", file, ErrCorrupt, n, fi.Size()-headerSize)
	}
	if s, ok := parseName(filepath.Base(file)); ok && s != step {
		return 0, nil, fmt.Errorf("%s: %w: the file holds step %d", file, ErrCorrupt, step)
	}
	state = make([]byte, n)
	if _, err := io.ReadFull(f, state); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, nil, fmt.Errorf("%s: %w: shorter than its header says (truncated while read?)", file, ErrCorrupt)
	} else if err != nil {
		return 0, nil, fmt.Errorf("checkpoint: read %s: %w", file, err)
	}
	if k, _ := f.Read(make([]byte, 1)); k != 0 {
		return 0, nil, fmt.Errorf("%s: %w: longer than its header says (appended to?)", file, ErrCorrupt)
	}
	if err := checkState(h[:], state); err != nil {
		return 0, nil, fmt.Errorf("%s: %w", file, err)
	}
	return step, state, nil
}

func openNonBlocking(file string) (*os.File, error) {
	return os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// Latest returns the newest valid checkpoint. Files that fail their checks
// are skipped (a crash in the middle of some other writer, a disk error); if
// none is valid it returns an error wrapping ErrNone, which names the files
// it skipped. A file removed between the listing and its opening (the pruner
// of a concurrent Save, which removes a checkpoint only after a newer one is
// in place) makes Latest list the directory again.
func (d Dir) Latest() (step int64, state []byte, err error) {
	const relists = 100
	var skipped []error
	for range relists {
		// A listing racing a Save can miss both the file renamed into
		// place and the one pruned after it (readdir is not atomic): when
		// nothing valid was found and the directory changed meanwhile,
		// list again.
		before := d.modTime()
		steps, err := d.list()
		if err != nil {
			return 0, nil, err
		}
		skipped = skipped[:0]
		vanished := !d.modTime().Equal(before)
		for _, s := range slices.Backward(steps) {
			step, state, err := Load(filepath.Join(d.Path, Name(s)))
			if err == nil {
				return step, state, nil
			}
			if errors.Is(err, os.ErrNotExist) {
				vanished = true
				continue
			}
			skipped = append(skipped, err)
		}
		if !vanished {
			break
		}
	}
	if len(skipped) == 0 {
		return 0, nil, fmt.Errorf("%w in %s", ErrNone, d.Path)
	}
	return 0, nil, fmt.Errorf("%w in %s: %w", ErrNone, d.Path, errors.Join(skipped...))
}

// modTime is the directory's modification time (zero if unknown), which
// every rename into it and removal from it changes.
func (d Dir) modTime() time.Time {
	fi, err := os.Stat(d.Path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// Steps returns the steps of the checkpoint files in the directory, oldest
// first, without checking them.
func (d Dir) Steps() ([]int64, error) { return d.list() }

func (d Dir) list() ([]int64, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", d.Path, err)
	}
	var steps []int64
	for _, e := range entries {
		// Regular files and links (checked when opened); a FIFO, socket or
		// device named like a checkpoint is not one.
		if t := e.Type(); !t.IsRegular() && t&os.ModeSymlink == 0 {
			continue
		}
		if s, ok := parseName(e.Name()); ok {
			steps = append(steps, s)
		}
	}
	slices.Sort(steps)
	return steps, nil
}

// prune removes the checkpoints older than the Keep-th newest valid one.
// Only checkpoints that pass Load's checks count against Keep; wrote, the
// step Save has just written (and checked as it wrote it), always counts and
// is never removed, nor is any file newer than the Keep-th valid one (a
// corrupt file is left for a person to look at, never a reason to remove a
// good one).
func (d Dir) prune(wrote int64) error {
	keep := d.Keep
	if keep == 0 {
		keep = DefaultKeep
	}
	keep = max(keep, 1)
	steps, err := d.list()
	if err != nil {
		return err
	}
	valid, cut := 0, -1
	for i, s := range slices.Backward(steps) {
		if s != wrote {
			if _, _, err := Load(filepath.Join(d.Path, Name(s))); err != nil {
				continue
			}
		}
		if valid++; valid == keep {
			cut = i
			break
		}
	}
	if cut < 0 {
		return nil
	}
	var errs []error
	for _, s := range steps[:cut] {
		if s == wrote {
			continue
		}
		if err := os.Remove(filepath.Join(d.Path, Name(s))); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("checkpoint: remove old checkpoints: %w", errors.Join(errs...))
	}
	return nil
}

// parseName returns the step of a checkpoint file name as Name writes it.
func parseName(name string) (int64, bool) {
	if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) {
		return 0, false
	}
	s, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(name, prefix), suffix), 10, 64)
	if err != nil || s < 0 || Name(s) != name {
		return 0, false
	}
	return s, true
}
