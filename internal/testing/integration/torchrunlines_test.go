package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/netport"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// lineScript writes, for each rank, torchrun's variables and the sum of an
// all-reduce over the world (gloo) into DIR/rank-RANK.json.
const lineScript = `import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"]
out = {k: os.environ.get(k) for k in keys}
out["sum"] = t.item()
json.dump(out, open(os.path.join(sys.argv[1], "rank-%s.json" % os.environ["RANK"]), "w"))
dist.destroy_process_group()
`

// freePort is a TCP port free on loopback now, that no connection is
// given before the launcher binds it (netport).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Two nodes of one machine, started at the same moment with the same c10d
// line on a loopback endpoint and no job token (torchrun's own
// test_launch_elastic shape): one runs the coordinator, the other takes
// the token from that launcher's run file, and the ranks see what they
// see under PyTorch's torchrun with the same lines.
func TestTorchrunLoopbackLinesNeedNoToken(t *testing.T) {
	path := needTorch(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "line.py")
	if err := os.WriteFile(script, []byte(lineScript), 0o644); err != nil {
		t.Fatal(err)
	}
	runPair := func(name string, argv func(out string, port int) []string) (map[string]map[string]any, []string) {
		t.Helper()
		out := filepath.Join(dir, name)
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		var wg sync.WaitGroup
		stderrs := make([]string, 2)
		codes := make([]int, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
				defer cancel()
				args := argv(out, port)
				cmd := gotrainCmd(ctx, t, []string{path, "GOTRAIN_JOB_TOKEN=", "GOTRAIN_SLURM=off"}, args[1:]...)
				cmd.Path, cmd.Args[0] = args[0], args[0]
				if args[0] == "gotrain" {
					cmd.Path, cmd.Args[0] = bin.gotrain, bin.gotrain
				}
				var e testkit.Buffer
				cmd.Stderr, cmd.Dir = &e, dir
				err := cmd.Run()
				stderrs[i] = e.String()
				if ee, ok := err.(*exec.ExitError); ok {
					codes[i] = ee.ExitCode()
				} else if err != nil {
					codes[i] = -1
					stderrs[i] += err.Error()
				}
				if ctx.Err() != nil {
					stderrs[i] += "\n(did not finish within 4 minutes)"
				}
			}()
		}
		wg.Wait()
		for i := range 2 {
			if codes[i] != 0 {
				t.Fatalf("%s line %d: exit %d\nstderr:\n%s", name, i, codes[i], stderrs[i])
			}
		}
		got := map[string]map[string]any{}
		for r := range 2 {
			b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", r)))
			if err != nil {
				t.Fatalf("%s: rank %d wrote nothing: %v\nstderr:\n%s\n%s", name, r, err, stderrs[0], stderrs[1])
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			got[fmt.Sprint(r)] = m
		}
		return got, stderrs
	}
	line := func(out string, port int) []string {
		return []string{"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", fmt.Sprintf("--rdzv_endpoint=localhost:%d", port), "--max_restarts=0", script, out}
	}
	ours, stderrs := runPair("gotrain", func(out string, port int) []string {
		return append([]string{"gotrain", "torchrun"}, line(out, port)...)
	})
	all := stderrs[0] + stderrs[1]
	if strings.Count(all, "the coordinator starts here") != 1 || strings.Count(all, "joining the coordinator at port") != 1 {
		t.Errorf("want one node to start the coordinator and one to join it with its run file's token:\n%s\n---\n%s", stderrs[0], stderrs[1])
	}
	if strings.Contains(all, "copy it to each node") && !strings.Contains(all, "coordinator listening") {
		t.Errorf("stderr asks to copy the token:\n%s", all)
	}
	theirs, _ := runPair("torchrun", func(out string, port int) []string {
		// Debian's torch 1.13 under Python 3.11 parses the default
		// --redirects/--tee "0" to None and fails: give them (stdout only).
		return append([]string{"/usr/bin/python3", "-m", "torch.distributed.run", "--redirects=1", "--tee=1"}, line(out, port)...)
	})
	// Which node gets group rank 0 is a race under both: compare the
	// world each rank saw and the sums, and that group ranks are 0 and 1.
	for r := range 2 {
		o, th := ours[fmt.Sprint(r)], theirs[fmt.Sprint(r)]
		for _, k := range []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "sum"} {
			if fmt.Sprint(o[k]) != fmt.Sprint(th[k]) {
				t.Errorf("rank %d %s: gotrain %v, torchrun %v", r, k, o[k], th[k])
			}
		}
	}
	if g0, g1 := fmt.Sprint(ours["0"]["GROUP_RANK"]), fmt.Sprint(ours["1"]["GROUP_RANK"]); g0+g1 != "01" {
		t.Errorf("group ranks %s, %s; want 0 and 1", g0, g1)
	}
}
