// Package wheel writes gotrain's Python wheel: a zip laid out as the wheel
// format (PEP 427, PEP 491) says, with the binary as a script the installer
// puts on the environment's PATH and the Python package beside it.
//
// It is written here rather than by a Python build backend because the
// machines that build gotrain reach no Python package index, and what a
// wheel holds is simple: files, a METADATA, a WHEEL and a RECORD of every
// file's hash and size.
package wheel

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
)

// File is one file of the wheel: its path inside the archive, its bytes,
// and whether it is executable.
type File struct {
	Name       string
	Data       []byte
	Executable bool
}

// Meta is what the wheel says of itself.
type Meta struct {
	Name, Version, Summary, HomePage, License string
	RequiresPython                            string
	// Tag is the wheel's compatibility tag, e.g. py3-none-manylinux_2_34_x86_64.
	Tag string
	// Description is METADATA's body (Markdown).
	Description string
}

var versionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*([a-z]+[0-9]+)?$`)

// FileName is the wheel's file name: NAME-VERSION-TAG.whl.
func (m Meta) FileName() string {
	return fmt.Sprintf("%s-%s-%s.whl", m.Name, m.Version, m.Tag)
}

func (m Meta) distInfo() string { return m.Name + "-" + m.Version + ".dist-info" }

// ScriptPath is where a script goes so that installing the wheel puts it on
// the environment's PATH (its bin/ directory), executable.
func (m Meta) ScriptPath(name string) string {
	return m.Name + "-" + m.Version + ".data/scripts/" + name
}

// epoch is every entry's time, so that the same inputs give the same wheel.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Write writes the wheel of files to w: the files, then METADATA, WHEEL and
// RECORD under NAME-VERSION.dist-info.
func Write(w io.Writer, m Meta, files []File) error {
	if !versionRE.MatchString(m.Version) {
		return fmt.Errorf("wheel: version %q is not a release version like 1.2.3", m.Version)
	}
	if m.Name == "" || m.Tag == "" {
		return fmt.Errorf("wheel: a name and a tag are needed")
	}
	files = append([]File(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	seen := map[string]bool{}
	for _, f := range files {
		if !fs.ValidPath(f.Name) || strings.HasPrefix(f.Name, m.distInfo()+"/") {
			return fmt.Errorf("wheel: bad file name %q", f.Name)
		}
		if seen[f.Name] {
			return fmt.Errorf("wheel: %q twice", f.Name)
		}
		seen[f.Name] = true
	}
	di := m.distInfo()
	files = append(files,
		File{Name: di + "/METADATA", Data: m.metadata()},
		File{Name: di + "/WHEEL", Data: m.wheelFile()})

	z := zip.NewWriter(w)
	var record bytes.Buffer
	for _, f := range files {
		if err := add(z, f); err != nil {
			return err
		}
		sum := sha256.Sum256(f.Data)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.Name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.Data))
	}
	// RECORD lists itself with no hash and no size.
	fmt.Fprintf(&record, "%s/RECORD,,\n", di)
	if err := add(z, File{Name: di + "/RECORD", Data: record.Bytes()}); err != nil {
		return err
	}
	return z.Close()
}

func add(z *zip.Writer, f File) error {
	h := &zip.FileHeader{Name: f.Name, Method: zip.Deflate, Modified: epoch}
	mode := fs.FileMode(0o644)
	if f.Executable {
		mode = 0o755
	}
	h.SetMode(mode)
	fw, err := z.CreateHeader(h)
	if err != nil {
		return fmt.Errorf("wheel: %s: %w", f.Name, err)
	}
	_, err = fw.Write(f.Data)
	return err
}

func (m Meta) metadata() []byte {
	var b strings.Builder
	b.WriteString("Metadata-Version: 2.1\n")
	fmt.Fprintf(&b, "Name: %s\nVersion: %s\n", m.Name, m.Version)
	for _, kv := range [][2]string{{"Summary", m.Summary}, {"Home-page", m.HomePage}, {"License", m.License}, {"Requires-Python", m.RequiresPython}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, "%s: %s\n", kv[0], kv[1])
		}
	}
	if m.Description != "" {
		b.WriteString("Description-Content-Type: text/markdown\n\n")
		b.WriteString(m.Description)
		if !strings.HasSuffix(m.Description, "\n") {
			b.WriteString("\n")
		}
	}
	return []byte(b.String())
}

func (m Meta) wheelFile() []byte {
	// Root-Is-Purelib false: the wheel holds a platform binary, so it
	// installs into platlib.
	return fmt.Appendf(nil, "Wheel-Version: 1.0\nGenerator: gotrain (internal/wheel)\nRoot-Is-Purelib: false\nTag: %s\n", m.Tag)
}

// PlatformTag is the wheel platform tag for a Linux binary of goarch built
// against glibc glibcMinor (2.N), e.g. manylinux_2_34_x86_64.
func PlatformTag(goarch string, glibcMinor int) (string, error) {
	arch, ok := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[goarch]
	if !ok {
		return "", fmt.Errorf("wheel: no manylinux tag for GOARCH %q (amd64 and arm64 have one)", goarch)
	}
	return fmt.Sprintf("manylinux_2_%d_%s", glibcMinor, arch), nil
}

// Verify reads a wheel back and checks its RECORD against its files: every
// file listed once, with its hash and size, and nothing unlisted.
func Verify(r io.ReaderAt, size int64) error {
	z, err := zip.NewReader(r, size)
	if err != nil {
		return fmt.Errorf("wheel: %w", err)
	}
	var record *zip.File
	for _, f := range z.File {
		if path.Base(f.Name) == "RECORD" && strings.HasSuffix(path.Dir(f.Name), ".dist-info") {
			record = f
		}
	}
	if record == nil {
		return fmt.Errorf("wheel: no RECORD")
	}
	rc, err := record.Open()
	if err != nil {
		return err
	}
	rec, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return err
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(rec)), "\n") {
		parts := strings.Split(line, ",")
		if len(parts) != 3 {
			return fmt.Errorf("wheel: RECORD line %q", line)
		}
		want[parts[0]] = parts[1] + "," + parts[2]
	}
	for _, f := range z.File {
		w, ok := want[f.Name]
		if !ok {
			return fmt.Errorf("wheel: %s is not in RECORD", f.Name)
		}
		delete(want, f.Name)
		if f == record {
			continue
		}
		fr, err := f.Open()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(fr)
		fr.Close()
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		if got := fmt.Sprintf("sha256=%s,%d", base64.RawURLEncoding.EncodeToString(sum[:]), len(data)); got != w {
			return fmt.Errorf("wheel: %s is %s, RECORD says %s", f.Name, got, w)
		}
	}
	for name := range want {
		return fmt.Errorf("wheel: RECORD lists %s, which is not in the wheel", name)
	}
	return nil
}
