package main

import (
	"fmt"
	"strconv"

	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/placement"
)

// --nproc-per-node takes a count or one of torchrun's words for one
// (torch.distributed.run): auto is one worker per GPU, or per CPU core
// without GPUs; gpu one per GPU, an error without them; cpu one per CPU
// core (on gotrain's CPU backend).

// nprocFlag is --nproc-per-node: N into n, or a word into word, which
// resolveNprocWord turns into a count once the GPUs are known.
type nprocFlag struct {
	n    *int
	word *string
}

func (f *nprocFlag) String() string {
	switch {
	case f.word != nil && *f.word != "":
		return *f.word
	case f.n != nil:
		return strconv.Itoa(*f.n)
	}
	return "0"
}

func (f *nprocFlag) Set(s string) error {
	switch s {
	case "auto", "gpu", "cpu":
		*f.word = s
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a number of workers, auto, gpu or cpu")
	}
	*f.n, *f.word = n, ""
	return nil
}

// resolveNprocWord sets cfg's worker count (and, for CPU workers, the
// backend when it was not given) from --nproc-per-node's word, knowing the
// node's GPUs and CPU cores; "" leaves cfg as it is.
func resolveNprocWord(cfg *launcher.Config, word string, gpus placement.GPUs, cpus int) error {
	if word == "" {
		return nil
	}
	perGPU := gpus.N * max(cfg.RanksPerGPU, 1)
	onCPUs := func() {
		cfg.NprocPerNode = max(cpus, 1)
		if cfg.Backend == "" {
			cfg.Backend = "cpu"
		}
	}
	switch {
	case word == "cpu", word == "auto" && gpus.N == 0:
		onCPUs()
	case gpus.N == 0: // gpu
		return &usageError{msg: fmt.Sprintf("--nproc-per-node gpu, but this machine has no NVIDIA GPU (%s)", gpus.How),
			hint: "Give --nproc-per-node cpu (one worker per CPU core) or a number with --backend cpu."}
	default:
		cfg.NprocPerNode = perGPU
	}
	return nil
}
