package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
