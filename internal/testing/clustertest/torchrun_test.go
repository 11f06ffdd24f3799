package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// torchPython is an interpreter that imports torch with gloo (Debian's
// python3-torch), or the test is skipped (failed with $CI set).
func torchPython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, py, "-c", "import torch.distributed as d; assert d.is_gloo_available()").CombinedOutput(); err != nil {
		why := fmt.Sprintf("%s does not import torch with gloo (%v: %s); apt-get install python3-torch", py, err, strings.TrimSpace(string(out)))
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	return py
}

// rankFile is what testdata/torchrun_env.py writes.
type rankFile struct {
	Rank       string  `json:"RANK"`
	WorldSize  string  `json:"WORLD_SIZE"`
	GroupRank  string  `json:"GROUP_RANK"`
	GroupWorld string  `json:"GROUP_WORLD_SIZE"`
	MasterAddr string  `json:"MASTER_ADDR"`
	RunID      string  `json:"TORCHELASTIC_RUN_ID"`
	Sum        float64 `json:"sum"`
	Host       string  `json:"host"`
}

// torchrunLine runs one torchrun command line per host of c (lines[i] on
// c.Hosts[i], started in the order given by order) with env, and waits for
// all of them.
func torchrunLine(t *testing.T, c *vcluster.Cluster, env []string, order []int, lines [][]string) []*vcluster.Proc {
	t.Helper()
	procs := make([]*vcluster.Proc, len(lines))
	for _, i := range order {
		procs[i] = c.Hosts[i].StartEnv(env, append([]string{bin.gotrain, "torchrun"}, lines[i]...)...)
	}
	for i, p := range procs {
		code, err := p.Wait(4 * time.Minute)
		if err != nil || code != 0 {
			t.Fatalf("%s: %v: exit %d, %v\nstderr:\n%s\n%s", c.Hosts[i].Name, lines[i], code, err, tail(p.Stderr(), 40), c.Dump())
		}
	}
	return procs
}

// checkRanks checks the files two one-rank nodes wrote: both ranks, the
// same world of 2 and one sum, node1 (the coordinator's node) group rank 0
// and MASTER_ADDR.
func checkRanks(t *testing.T, c *vcluster.Cluster, dir string) {
	t.Helper()
	var runID string
	for rank, host := range []*vcluster.Host{c.Hosts[0], c.Hosts[1]} {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.json", rank)))
		if err != nil {
			t.Fatalf("rank %d wrote nothing: %v", rank, err)
		}
		var f rankFile
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("rank %d: %v: %s", rank, err, b)
		}
		if f.WorldSize != "2" || f.GroupWorld != "2" || f.Sum != 3 || f.GroupRank != fmt.Sprint(rank) || f.Host != host.Name || f.MasterAddr != c.Hosts[0].IP {
			t.Errorf("rank %d: %+v; want world 2 on 2 nodes, sum 3, group rank %d on %s, MASTER_ADDR %s", rank, f, rank, host.Name, c.Hosts[0].IP)
		}
		if runID == "" {
			runID = f.RunID
		} else if f.RunID != runID {
			t.Errorf("ranks in two runs: %q and %q", runID, f.RunID)
		}
	}
}

// PyTorch's multi-node command lines, run on two hosts as torchrun's users
// run them (the same line on every node; the joiner started first, as a
// scheduler may), form one job with nothing copied between the nodes but
// the job token that both get from their environment: a c10d endpoint
// naming node1 makes node1 the coordinator; static --node_rank lines make
// node rank 0 it. Without any shared secret both nodes are refused at once.
func TestTorchrunMultiNodeLines(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	script, err := filepath.Abs("testdata/torchrun_env.py")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 2)
	env := []string{"PYTHON_EXEC=" + py, "GLOO_SOCKET_IFNAME=eth0", "GOTRAIN_SLURM=off"}
	common := []string{"--nnodes=2", "--nproc_per_node=1", "--max_restarts=0"}

	t.Run("c10d", func(t *testing.T) {
		dir := t.TempDir()
		line := append(append([]string(nil), common...), "--rdzv_backend=c10d", "--rdzv_endpoint="+c.Hosts[0].IP+":29400", "--rdzv_id=job1", script, dir)
		procs := torchrunLine(t, c, env, []int{1, 0}, [][]string{line, line})
		checkRanks(t, c, dir)
		if !strings.Contains(procs[0].Stderr(), c.Hosts[0].IP+" names this machine: the coordinator starts here") {
			t.Errorf("node1 does not say it runs the coordinator:\n%s", procs[0].Stderr())
		}
	})
	t.Run("static", func(t *testing.T) {
		dir := t.TempDir()
		var lines [][]string
		for rank := range 2 {
			lines = append(lines, append(append([]string(nil), common...), fmt.Sprintf("--node_rank=%d", rank),
				"--master_addr="+c.Hosts[0].IP, "--master_port=29500", script, dir))
		}
		torchrunLine(t, c, env, []int{1, 0}, lines)
		checkRanks(t, c, dir)
	})
	t.Run("no secret", func(t *testing.T) {
		line := append(append([]string(nil), common...), "--rdzv_backend=c10d", "--rdzv_endpoint="+c.Hosts[0].IP+":29401", script, t.TempDir())
		for _, h := range c.Hosts {
			p := h.StartEnv(append(env, "GOTRAIN_JOB_TOKEN="), append([]string{bin.gotrain, "torchrun"}, line...)...)
			code, err := p.Wait(time.Minute)
			if err != nil || code != 2 || !strings.Contains(p.Stderr(), "no secret was given") || !strings.Contains(p.Stderr(), "GOTRAIN_JOB_TOKEN") {
				t.Errorf("%s without a token: exit %d (%v), stderr:\n%s\nwant exit 2 at once saying no secret was given and how to give one", h.Name, code, err, p.Stderr())
			}
		}
	})
}
