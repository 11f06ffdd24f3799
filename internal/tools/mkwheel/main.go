// Command mkwheel writes gotrain's wheel (`make wheel`): the gotrain binary
// as a script pip puts on the environment's PATH, and the Python package
// gotrain, which programs import. The platform tag comes from the binary:
// its architecture, and the newest glibc symbol version it needs.
//
//	go run ./internal/tools/mkwheel -binary bin/release/linux_amd64/gotrain -out dist
package main

import (
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/wheel"
	"github.com/gotrain/gotrain/python"
)

const description = `# gotrain

A launcher for data-parallel training on NVIDIA GPUs, from one box to a
cluster: a drop-in for torchrun (` + "`gotrain torchrun train.py`" + `) that restarts in a
fraction of a second, keeps training state in memory, and names the rank
that hangs.

This wheel installs the ` + "`gotrain`" + ` binary onto the environment's PATH
(also ` + "`python -m gotrain`" + `) and the Python package ` + "`gotrain`" + ` (in-memory
snapshots, their torch.distributed.checkpoint storage), which imports and
does nothing outside a gotrain job.
`

func main() {
	binary := flag.String("binary", "", "the gotrain binary to ship (Linux, amd64 or arm64)")
	out := flag.String("out", "dist", "directory to write the wheel into")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: mkwheel -binary PATH [-out DIR]\n\nWrites gotrain-VERSION-py3-none-manylinux_2_N_ARCH.whl (VERSION: the Python\npackage's __version__).\n\nExample:\n  go run ./internal/tools/mkwheel -binary bin/release/linux_amd64/gotrain -out dist\n")
	}
	flag.Parse()
	if *binary == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	name, err := run(*binary, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkwheel:", err)
		os.Exit(1)
	}
	fmt.Println(name)
}

func run(binary, out string) (string, error) {
	exe, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	goarch, glibc, err := inspect(binary)
	if err != nil {
		return "", err
	}
	plat, err := wheel.PlatformTag(goarch, glibc)
	if err != nil {
		return "", err
	}
	m := wheel.Meta{
		Name: "gotrain", Version: python.Version, Tag: "py3-none-" + plat,
		Summary:        "Data-parallel training launcher for NVIDIA GPUs: a faster-recovering drop-in for torchrun",
		RequiresPython: ">=3.8", License: "Apache-2.0", Description: description,
	}
	files := []wheel.File{{Name: m.ScriptPath("gotrain"), Data: exe, Executable: true}}
	err = fs.WalkDir(python.Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(python.Files(), p)
		files = append(files, wheel.File{Name: p, Data: b})
		return err
	})
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := wheel.Write(&buf, m, files); err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(out, m.FileName())
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// inspect returns the binary's GOARCH and the newest glibc 2.N it needs
// (17, the oldest manylinux baseline, when it links no glibc: a static
// build).
func inspect(binary string) (string, int, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return "", 0, fmt.Errorf("%s is not a Linux binary: %w", binary, err)
	}
	defer f.Close()
	goarch := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[f.Machine]
	if goarch == "" {
		return "", 0, fmt.Errorf("%s is built for %s; the wheel ships amd64 or arm64", binary, f.Machine)
	}
	minor := 17
	syms, err := f.ImportedSymbols()
	if err != nil && f.Section(".dynsym") != nil {
		return "", 0, fmt.Errorf("read %s's imported symbols: %w", binary, err)
	}
	for _, s := range syms {
		v, ok := strings.CutPrefix(s.Version, "GLIBC_2.")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, ".")
		if n, err := strconv.Atoi(v); err == nil && n > minor {
			minor = n
		}
	}
	return goarch, minor, nil
}
