package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestSaveLatestKeep(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "ck"), Keep: 2}
	if _, _, err := d.Latest(); !errors.Is(err, ErrNone) {
		t.Fatalf("empty dir: %v", err)
	}
	for s := int64(1); s <= 4; s++ {
		if err := d.Save(s*10, bytes.Repeat([]byte{byte(s)}, int(s)*100)); err != nil {
			t.Fatal(err)
		}
	}
	steps, _ := d.Steps()
	if !slices.Equal(steps, []int64{30, 40}) {
		t.Errorf("kept %v, want [30 40]", steps)
	}
	step, state, err := d.Latest()
	if err != nil || step != 40 || !bytes.Equal(state, bytes.Repeat([]byte{4}, 400)) {
		t.Fatalf("Latest = %d, %d bytes, %v", step, len(state), err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(d.Path, ".tmp-*")); len(tmp) > 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

// A torn, truncated or corrupt newest file is never loaded: Latest falls back
// to the previous checkpoint.
func TestLatestSkipsDamagedFiles(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"truncated header": func(b []byte) []byte { return b[:10] },
		"truncated state":  func(b []byte) []byte { return b[:len(b)-1] },
		"empty":            func(b []byte) []byte { return nil },
		"flipped state bit": func(b []byte) []byte {
			b[len(b)-1] ^= 1
			return b
		},
		"flipped header bit": func(b []byte) []byte {
			b[17] ^= 1
			return b
		},
		"appended garbage": func(b []byte) []byte { return append(b, 0) },
		"wrong step":       func(b []byte) []byte { return append(encodeHeader(7, b[headerSize:]), b[headerSize:]...) },
	} {
		t.Run(name, func(t *testing.T) {
			d := Dir{Path: t.TempDir()}
			if err := d.Save(1, []byte("old state")); err != nil {
				t.Fatal(err)
			}
			if err := d.Save(2, []byte("new state")); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(d.Path, Name(2))
			b, _ := os.ReadFile(f)
			if err := os.WriteFile(f, damage(b), 0o644); err != nil {
				t.Fatal(err)
			}
			step, state, err := d.Latest()
			if err != nil || step != 1 || string(state) != "old state" {
				t.Errorf("Latest = %d, %q, %v; want 1, old state", step, state, err)
			}
			if _, _, err := Load(f); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Load of the damaged file: %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestLatestIgnoresTempAndForeignFiles(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if err := d.Save(5, []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{".tmp-" + Name(9) + "-123", "ckpt-9.gtck", "notes.txt", "ckpt-abc.gtck"} {
		if err := os.WriteFile(filepath.Join(d.Path, n), []byte("junk"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if step, _, err := d.Latest(); err != nil || step != 5 {
		t.Errorf("Latest = %d, %v", step, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(append(encodeHeader(3, []byte("abc")), "abc"...))
	f.Add([]byte("GTCKPT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		step, state, err := Decode(b)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to the same bytes.
		if again := append(encodeHeader(step, state), state...); !bytes.Equal(again, b) {
			t.Errorf("Decode(%x) = %d, %x, which encodes differently", b, step, state)
		}
	})
}

// With Keep 1 and a corrupt file whose name claims a newer
// step, Save used to delete the checkpoint it had just written. Only verified
// checkpoints count against Keep, and Save never deletes what it wrote.
func TestSaveKeepsItsCheckpointBesideCorruptNewerFiles(t *testing.T) {
	for _, keep := range []int{1, 2} {
		d := Dir{Path: t.TempDir(), Keep: keep}
		if err := os.WriteFile(filepath.Join(d.Path, Name(1000)), []byte("not a checkpoint"), 0o644); err != nil {
			t.Fatal(err)
		}
		for s := int64(1); s <= 4; s++ {
			if err := d.Save(s, []byte{byte(s)}); err != nil {
				t.Fatalf("keep %d: Save(%d): %v", keep, s, err)
			}
			step, state, err := d.Latest()
			if err != nil || step != s || !bytes.Equal(state, []byte{byte(s)}) {
				t.Fatalf("keep %d: after Save(%d): Latest = %d, %x, %v", keep, s, step, state, err)
			}
		}
		var valid []int64
		steps, _ := d.Steps()
		for _, s := range steps {
			if _, _, err := Load(filepath.Join(d.Path, Name(s))); err == nil {
				valid = append(valid, s)
			}
		}
		if want := []int64{5 - int64(keep), 4}[2-keep:]; !slices.Equal(valid, want) {
			t.Errorf("keep %d: valid checkpoints kept %v, want %v", keep, valid, want)
		}
	}
}

// Saving an older step than the newest valid checkpoint (a caller that went
// back) neither deletes the file just written nor the newest valid one.
func TestSaveOlderStepKeepsBoth(t *testing.T) {
	d := Dir{Path: t.TempDir(), Keep: 1}
	for _, s := range []int64{10, 5} {
		if err := d.Save(s, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []int64{5, 10} {
		if _, _, err := Load(filepath.Join(d.Path, Name(s))); err != nil {
			t.Errorf("step %d: %v", s, err)
		}
	}
}

// A FIFO named like a checkpoint blocked Latest (and Save's
// pruning) forever. Non-regular files are skipped.
func TestFIFONamedLikeACheckpointIsSkipped(t *testing.T) {
	d := Dir{Path: t.TempDir(), Keep: 1}
	if err := d.Save(5, []byte("five")); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(filepath.Join(d.Path, Name(9))); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		step, state, err := d.Latest()
		if err == nil && (step != 5 || string(state) != "five") {
			err = fmt.Errorf("Latest = %d, %q; want 5, five", step, state)
		}
		if err == nil {
			err = d.Save(6, []byte("six"))
		}
		if err == nil {
			step, _, err = d.Latest()
			if err == nil && step != 6 {
				err = fmt.Errorf("Latest after Save(6) = %d", step)
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the goroutine so the test binary can exit.
		if f, err := os.OpenFile(filepath.Join(d.Path, Name(9)), os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("Latest or Save blocked on a FIFO named like a checkpoint")
	}
}

// A large garbage file named like a checkpoint was read
// whole (io.ReadAll: twice its size in allocations) before its header was
// checked. The header and size are checked first.
func TestGarbageFileIsRejectedBeforeAllocating(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if err := d.Save(1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	const size = 256 << 20
	f, err := os.Create(filepath.Join(d.Path, Name(2)))
	if err != nil {
		t.Fatal(err)
	}
	// A sparse file: no disk used, all zeros, so no valid header.
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	step, _, err := d.Latest()
	runtime.ReadMemStats(&after)
	if err != nil || step != 1 {
		t.Fatalf("Latest = %d, %v", step, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("Latest allocated %d bytes to reject a %d-byte garbage file", alloc, size)
	}
	// A valid header that claims more state than the file holds is
	// rejected without allocating what it claims.
	hdr := encodeHeader(3, nil)
	binary.LittleEndian.PutUint64(hdr[24:], 1<<30)
	binary.LittleEndian.PutUint32(hdr[36:], crc32.Checksum(hdr[:36], castagnoli))
	if err := os.WriteFile(filepath.Join(d.Path, Name(3)), hdr, 0o644); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err = Load(filepath.Join(d.Path, Name(3)))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Load of a header claiming 1 GiB: %v, want ErrCorrupt", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("Load allocated %d bytes for a header-only file", alloc)
	}
}

// A reader racing the pruner saw "no valid checkpoint" in
// about 1% of calls (it listed step n, the pruner removed n after writing
// n+1, the open failed). Run with -race.
func TestLatestRacingPrunerAlwaysFindsACheckpoint(t *testing.T) {
	d := Dir{Path: t.TempDir(), Keep: 1}
	if err := d.Save(0, []byte{0}); err != nil {
		t.Fatal(err)
	}
	const saves = 300
	done := make(chan error, 1)
	go func() {
		for s := int64(1); s <= saves; s++ {
			if err := d.Save(s, []byte{byte(s)}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var reads, fails int
	var last int64
	var firstErr error
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished = true
		default:
		}
		step, state, err := d.Latest()
		reads++
		switch {
		case err != nil:
			fails++
			firstErr = cmp.Or(firstErr, err)
		case step < last || !bytes.Equal(state, []byte{byte(step)}):
			t.Fatalf("Latest = %d, %x after step %d", step, state, last)
		default:
			last = step
		}
	}
	if fails > 0 {
		t.Errorf("%d of %d Latest calls racing the pruner failed; first: %v", fails, reads, firstErr)
	}
	if reads < saves/10 {
		t.Logf("only %d reads raced %d saves", reads, saves)
	}
}
