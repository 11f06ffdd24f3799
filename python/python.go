// Package python holds gotrain's Python package (gotrain: the snapshot
// tier, its torch.distributed.checkpoint storage) and the module name
// earlier versions gave it (gotrain_snapshot), as the tree keeps them, so
// that the agent writes the very files a program can also import from a
// checkout or an installed package. WriteTo puts them where a worker's
// interpreter finds them.
package python

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

//go:embed gotrain/*.py gotrain_snapshot.py
var files embed.FS

// Version is the package's __version__.
var Version = func() string {
	b, err := files.ReadFile("gotrain/__init__.py")
	if err != nil {
		panic(err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		panic("python/gotrain/__init__.py has no __version__")
	}
	return string(m[1])
}()

// WriteTo writes the package into dir (made 0700 if missing), files 0600:
// dir goes on the workers' PYTHONPATH.
func WriteTo(dir string) error {
	return fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out := filepath.Join(dir, filepath.FromSlash(path))
		if d.IsDir() {
			return os.MkdirAll(out, 0o700)
		}
		b, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o600); err != nil {
			return fmt.Errorf("write gotrain's Python package into %s: %w", dir, err)
		}
		return nil
	})
}

// Files is the package as the tree keeps it: gotrain/*.py and
// gotrain_snapshot.py, for the wheel (internal/wheel).
func Files() fs.FS { return files }
