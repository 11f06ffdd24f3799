package pystandby

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// torchPython is an interpreter that imports torch, or the test skips
// (fails under CI=true, where .ci/run installs python3-torch).
func torchPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		err := exec.CommandContext(ctx, py, "-c", "import torch.distributed").Run()
		cancel()
		if err == nil {
			return py
		}
	}
	why := "no python3 imports torch; install it with: apt-get install --no-install-recommends python3-torch"
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

// A standby imports the modules it is told to preload, in order: one
// that fails to import (or exits at import) is skipped and the standby
// lives on; once the time bound is spent, the rest are left.
func TestStandbyPreloadsWithinBounds(t *testing.T) {
	py := torchPython(t)
	mods := t.TempDir()
	for name, src := range map[string]string{
		"gt_exits_at_import.py": "raise SystemExit(3)\n",
		"gt_slow.py":            "import time\ntime.sleep(1.5)\n",
		"gt_after_slow.py":      "\n",
		"gt_fine.py":            "\n",
	} {
		if err := os.WriteFile(filepath.Join(mods, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	link, theirs, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	prog := &Program{path: "unused.py"}
	cmd := exec.CommandContext(t.Context(), py, prog.Command(-1, nil, 0)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+mods)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = theirs.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(link.conn)
	next := func() pyMessage {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("the standby said nothing more: %v", sc.Err())
		}
		var m pyMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		return m
	}
	if m := next(); !m.Ready {
		t.Fatalf("first message %+v, want ready", m)
	}
	if err := link.Preload([]string{"gt_fine", "gt_nosuch", "gt_exits_at_import", "torch", "gt_slow", "gt_after_slow"}, 1.0, PreloadGrowth); err != nil {
		t.Fatal(err)
	}
	m := next()
	if m.Preloaded == nil || !slices.Equal(*m.Preloaded, []string{"gt_fine", "gt_slow"}) || m.Tried != 6 {
		t.Errorf("preloaded %v of %d; want gt_fine and gt_slow (torch was there, two fail, the time is spent after gt_slow) of 6", m.Preloaded, m.Tried)
	}
	// Still a standby: a second list is taken as well.
	if err := link.Preload([]string{"gt_after_slow"}, PreloadSeconds, PreloadGrowth); err != nil {
		t.Fatal(err)
	}
	if m := next(); m.Preloaded == nil || !slices.Equal(*m.Preloaded, []string{"gt_after_slow"}) {
		t.Errorf("second list: preloaded %v, want gt_after_slow", m.Preloaded)
	}
}
