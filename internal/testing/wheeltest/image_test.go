package wheeltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/python"
)

// TestImageHoldsTheBinary builds the Dockerfile's image with buildah (vfs
// storage under a temporary root, as root, offline: the build ships the
// binary make release-bin wrote, so no base image is pulled), copies
// /gotrain out of it as a user's COPY --from would, and runs it.
func TestImageHoldsTheBinary(t *testing.T) {
	if _, err := exec.LookPath("buildah"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs buildah (Debian's buildah) to build the image")
		}
		t.Skip("no buildah")
	}
	if os.Geteuid() != 0 {
		t.Skip("buildah with vfs storage runs here as root")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	store := []string{"--root", filepath.Join(tmp, "storage"), "--runroot", filepath.Join(tmp, "run"), "--storage-driver", "vfs"}
	buildah := func(args ...string) string {
		return strings.TrimSpace(run(t, 5*time.Minute, root, "buildah", append(append([]string{}, store...), args...)...))
	}
	run(t, 10*time.Minute, root, "make", "--no-print-directory", "release-bin")
	buildah("build", "--quiet", "--build-arg", "BINARY_FROM=prebuilt", "-t", "localhost/gotrain:test", ".")
	ctr := buildah("from", "--quiet", "localhost/gotrain:test")
	t.Cleanup(func() { exec.Command("buildah", append(append([]string{}, store...), "rm", ctr)...).Run() })
	mnt := buildah("mount", ctr)
	t.Cleanup(func() { exec.Command("buildah", append(append([]string{}, store...), "umount", ctr)...).Run() })

	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "gotrain" {
		t.Errorf("the image holds %v, want /gotrain alone", names)
	}
	out := filepath.Join(tmp, "gotrain")
	data, err := os.ReadFile(filepath.Join(mnt, "gotrain"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if v := run(t, time.Minute, tmp, out, "version"); !strings.Contains(v, "gotrain "+python.Version+" (release build)") {
		t.Errorf("the binary copied out of the image says:\n%s", v)
	}
	if o := run(t, 2*time.Minute, tmp, out, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE"); !strings.Contains(o, "[rank 1] rank 1 of 2") {
		t.Errorf("a job under the binary from the image:\n%s", o)
	}
}
