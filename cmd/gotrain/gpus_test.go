package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/placement"
)

// chooseBackend on machines of 0, 2 and 8 GPUs: --gpus means GPUs, CPU
// workers run when asked, and every refusal names what was found.
func TestChooseBackend(t *testing.T) {
	none := placement.GPUs{How: "no /dev/nvidia0... device files; no NVIDIA driver found (NVML: libnvidia-ml.so.1 not loadable)"}
	two := placement.GPUs{N: 2, How: "NVML counts 2"}
	for _, tc := range []struct {
		name    string
		nproc   int
		backend string
		given   []string
		found   placement.GPUs
		// want: the backend and count chosen, or the error's text.
		wantBackend string
		wantN       int
		wantErr     string
		hint        string
		warn        string
	}{
		{name: "--gpus 8 without GPUs", nproc: 8, given: []string{"gpus"}, found: none,
			wantErr: "--gpus 8, but this machine has no NVIDIA GPU (" + none.How + ")", hint: "To run on CPUs, pass --backend cpu --nproc-per-node 8."},
		{name: "--gpus 8 on two", nproc: 8, given: []string{"gpus"}, found: two,
			wantErr: "--gpus 8, but this machine has 2 NVIDIA GPU(s) (NVML counts 2)", hint: "--backend cpu --nproc-per-node 8"},
		{name: "--gpus 2 on two", nproc: 2, given: []string{"gpus"}, found: two, wantBackend: "nccl", wantN: 2},
		{name: "--gpus with --backend cpu", nproc: 2, backend: "cpu", given: []string{"gpus", "backend"}, found: two, wantErr: "--gpus 2 with --backend cpu"},
		{name: "--gpus and --nproc-per-node", nproc: 2, given: []string{"gpus", "nproc-per-node"}, found: two, wantErr: "both given"},
		{name: "nothing on two", found: two, wantBackend: "nccl", wantN: 2},
		{name: "nothing without GPUs", found: none, wantErr: "no NVIDIA GPU found on this machine (" + none.How + "), so there is no default worker count"},
		{name: "--nproc-per-node 4 without GPUs", nproc: 4, given: []string{"nproc-per-node"}, found: none, wantBackend: "cpu", wantN: 4,
			warn: "gotrain: warning: no NVIDIA GPU on this machine (" + none.How + "): the 4 workers run on the CPU backend; pass --backend cpu to say so, or --gpus 4 to require GPUs"},
		{name: "--nproc-per-node 4 on two", nproc: 4, given: []string{"nproc-per-node"}, found: two, wantErr: "--nproc-per-node 4, but this machine has 2 NVIDIA GPU(s)"},
		{name: "--nproc-per-node 1 on two", nproc: 1, given: []string{"nproc-per-node"}, found: two, wantBackend: "nccl", wantN: 1},
		{name: "README demo", nproc: 4, backend: "cpu", given: []string{"nproc-per-node", "backend"}, found: none, wantBackend: "cpu", wantN: 4},
		{name: "--backend cpu on two", backend: "cpu", given: []string{"backend"}, found: two, wantBackend: "cpu", wantN: 2},
		{name: "--backend cpu alone without GPUs", backend: "cpu", given: []string{"backend"}, found: none, wantErr: "--backend cpu without --nproc-per-node"},
		{name: "--backend nccl without GPUs", nproc: 2, backend: "nccl", given: []string{"nproc-per-node", "backend"}, found: none, wantErr: "--backend nccl, but this machine has no NVIDIA GPU (" + none.How + ")"},
		{name: "--backend nccl, too many", nproc: 3, backend: "nccl", given: []string{"nproc-per-node", "backend"}, found: two, wantErr: "--nproc-per-node 3 with --backend nccl, but this machine has 2 NVIDIA GPU(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := launcher.Config{NprocPerNode: tc.nproc, Backend: tc.backend}
			given := map[string]bool{}
			for _, g := range tc.given {
				given[g] = true
			}
			var warned []string
			err := chooseBackend(&cfg, given, tc.found, func(w string) { warned = append(warned, w) })
			if tc.wantErr != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(ue.msg, tc.wantErr) || !strings.Contains(ue.hint, tc.hint) {
					t.Fatalf("err %v; want a usage error %q with the hint %q", err, tc.wantErr, tc.hint)
				}
				return
			}
			if err != nil || cfg.Backend != tc.wantBackend || cfg.NprocPerNode != tc.wantN {
				t.Fatalf("backend %q, %d workers, err %v; want %q, %d", cfg.Backend, cfg.NprocPerNode, err, tc.wantBackend, tc.wantN)
			}
			if got := strings.Join(warned, "\n"); got != tc.warn {
				t.Errorf("warned %q, want %q", got, tc.warn)
			}
		})
	}
}
