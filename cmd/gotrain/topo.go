package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/gpu/topo"
)

type topoCmd struct{}

func (*topoCmd) name() string { return "topo" }
func (*topoCmd) synopsis() string {
	return "print how this node's GPUs are connected (NVLink, PCIe, NUMA)"
}

const topoUsage = `
Usage: gotrain topo [--json]

Prints the GPU topology matrix as 'nvidia-smi topo -m' does: for each pair of
GPUs NV<n> (n bonded NVLinks) or the PCIe path (PIX, PXB, PHB, NODE, SYS),
then each GPU's CPU and NUMA affinity. gotrain launch orders local ranks
along NVLink and pins each worker to its GPU's CPUs from the same facts.

On a machine without NVIDIA GPUs it says so and exits 0.

Examples:
  gotrain topo                        # the matrix, as nvidia-smi topo -m
  gotrain topo --json | jq '.gpus'    # for scripts
`

func (c *topoCmd) run(_ context.Context, args []string) error {
	fs := newFlagSet(c.name(), topoUsage)
	asJSON := fs.Bool("json", false, "print the topology as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	n, err := gpuinfo.Open()
	if err != nil {
		var nd *gpuinfo.NoDriverError
		if errors.As(err, &nd) {
			err = fmt.Errorf("no NVIDIA GPUs found (NVML: %s)", nd.Reason)
		}
		return topoNoGPUs(*asJSON, err)
	}
	defer n.Close()
	t, err := topo.Discover(n)
	if err != nil {
		return err
	}
	if len(t.GPUs) == 0 {
		return topoNoGPUs(*asJSON, fmt.Errorf("no NVIDIA GPUs found (NVML sees none)"))
	}
	if *asJSON {
		return printIndentedJSON(t)
	}
	return t.WriteMatrix(os.Stdout)
}

// topoNoGPUs is topo's answer on a machine without GPUs or a driver: not an error.
func topoNoGPUs(asJSON bool, why error) error {
	if asJSON {
		b, err := topo.EmptyJSON(why.Error())
		if err != nil {
			return err
		}
		_, err = fmt.Printf("%s\n", b)
		return err
	}
	_, err := fmt.Println(why)
	return err
}

// printIndentedJSON writes v to stdout as indented JSON.
func printIndentedJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
