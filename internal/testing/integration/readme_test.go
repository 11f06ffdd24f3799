package integration

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docs/clusters.md's "Several nodes" commands, run as written where one machine can
// run them: two agents (or a standalone coordinator and two agents) on
// loopback. What a person must change on one machine is changed, and only
// that (readmeLoopback); everything else — the flags, the line the first
// node prints, the token file it names, the hash — is README's. TestMNISTDemo
// runs README's demo command.

// readmeBlocks returns the code blocks of docs/clusters.md's section
// titled title (up to the next ## heading), each as its lines.
func readmeBlocks(t *testing.T, title string) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "clusters.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/clusters.md has no section %q", title)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var blocks [][]string
	var cur []string
	in := false
	for _, l := range strings.Split(sec, "\n") {
		switch {
		case strings.HasPrefix(l, "```") && in:
			blocks, cur = append(blocks, cur), nil
			in = false
		case strings.HasPrefix(l, "```"):
			in = true
		case in:
			cur = append(cur, l)
		}
	}
	return blocks
}

// readmeBlock returns the code block of blocks whose first line starts
// with prefix.
func readmeBlock(t *testing.T, blocks [][]string, prefix string) []string {
	t.Helper()
	for _, b := range blocks {
		if len(b) > 0 && strings.HasPrefix(b[0], prefix) {
			return b
		}
	}
	t.Fatalf("README's Several nodes section has no code block starting %q", prefix)
	return nil
}

// printedLine turns README's example of a line gotrain prints into a
// pattern: the values of README's example (addresses, the hash, the token
// file, the run id) match any, and the submatches named addr, hash and
// file are the printed ones.
func printedLine(t *testing.T, example string) *regexp.Regexp {
	t.Helper()
	p := regexp.QuoteMeta(example)
	for _, v := range []struct{ lit, re string }{
		{"sha256:5f0c…", `(?P<hash>sha256:[0-9a-f]{64})`},
		{"--coordinator 10.0.0.1:29400", `--coordinator (?P<addr>\S+)`},
		{"--coordinator THIS_HOST:29400", `--coordinator THIS_HOST:(?P<port>\d+)`},
		{"$(cat /run/user/1000/gotrain/gotrain-1a2b3c4d-4242.token)", `\$\(cat (?P<file>\S+)\)`},
		{"on 0.0.0.0:29400", `on \S+`},
		{"listening on 10.0.0.1:29400", `listening on \S+`},
		{"on [::]:29400", `on \S+`},
		{"gotrain-1a2b3c4d", `\S+`},
	} {
		p = strings.ReplaceAll(p, regexp.QuoteMeta(v.lit), v.re)
	}
	return regexp.MustCompile(strings.TrimSuffix(p, regexp.QuoteMeta("...")))
}

// readmeLoopback is README's command line cmd (after "HOST$ ") for this
// machine: the environment it sets, and gotrain's arguments. vals gives
// the values README elides (addr, hash, token) once they are known.
func readmeLoopback(t *testing.T, cmd string, vals map[string]string) (env, args []string) {
	t.Helper()
	f := strings.Fields(cmd)
	for len(f) > 0 && strings.Contains(f[0], "=") {
		k, v, _ := strings.Cut(f[0], "=")
		if v == "$(cat" { // GOTRAIN_JOB_TOKEN=$(cat ~/.gotrain-token)
			v, f = vals["token"], f[1:]
		}
		env, f = append(env, k+"="+v), f[1:]
	}
	if len(f) == 0 || f[0] != "gotrain" {
		t.Fatalf("README's %q does not run gotrain", cmd)
	}
	for i := 1; i < len(f); i++ {
		a := f[i]
		switch {
		case a == "--gpus": // no GPUs here: as many CPU ranks
			args, i = append(args, "--nproc-per-node", "1", "--backend", "cpu"), i+1
		case a == "--coordinator":
			args, i = append(args, a, vals["addr"]), i+1
		case a == "--ca-hash":
			args, i = append(args, a, vals["hash"]), i+1
		case a == "--listen": // any free port, not 29400: other jobs run here
			args, i = append(args, a, "0.0.0.0:0"), i+1
		case a == "./train":
			args = append(args, bin.testprog, "env")
		default:
			args = append(args, a)
		}
	}
	if args[0] == "launch" { // the address other nodes reach this one at
		args = append([]string{"launch", "--node-addr", "127.0.0.1"}, args[1:]...)
		if vals["addr"] == "" {
			args = append([]string{"launch", "--coordinator-listen", "127.0.0.1:0"}, args[1:]...)
		}
	}
	return env, args
}

func startEnv(t *testing.T, env []string, args ...string) *job {
	t.Helper()
	j := &job{cmd: gotrainCmd(context.Background(), t, env, args...), done: make(chan struct{})}
	j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.err
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() { _ = j.cmd.Process.Kill(); <-j.done })
	return j
}

// waitPrinted waits for j to print a line matching re and returns its
// named submatches.
func waitPrinted(t *testing.T, j *job, re *regexp.Regexp) map[string]string {
	t.Helper()
	var m []string
	waitOutput(t, j, "the line README shows: "+re.String(), func() bool {
		m = re.FindStringSubmatch(j.err.String())
		return m != nil
	})
	out := map[string]string{}
	for i, n := range re.SubexpNames() {
		if n != "" {
			out[n] = m[i]
		}
	}
	return out
}

// checkTwoRanks: both agents exit 0, each with its one rank of world 2.
func checkTwoRanks(t *testing.T, js ...*job) {
	t.Helper()
	for i, code := range exits(t, 2*time.Minute, js...) {
		if code != 0 {
			t.Fatalf("process %d exited %d\n%s", i, code, dump(js...))
		}
	}
	for i, j := range js[:2] {
		if !strings.Contains(j.out.String(), "[rank "+string(rune('0'+i))+"] WORLD_SIZE=2") {
			t.Errorf("node %d's rank %d does not see WORLD_SIZE=2\n%s", i, i, dump(js...))
		}
	}
}

// The first node starts the coordinator and prints the second's command;
// the second runs it with the token from the file the line names.
func TestReadmeSeveralNodesFirstNode(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, readmeBlocks(t, "Several nodes"), "node0$ ")
	if len(block) != 4 {
		t.Fatalf("README's first-node example changed shape (node0$, its line, node1$ export, node1$ launch):\n%s", strings.Join(block, "\n"))
	}
	env, args := readmeLoopback(t, strings.TrimPrefix(block[0], "node0$ "), map[string]string{})
	first := startEnv(t, env, args...)
	got := waitPrinted(t, first, printedLine(t, block[1]))
	if !strings.HasPrefix(block[2], "node1$ export GOTRAIN_JOB_TOKEN=") {
		t.Fatalf("README's node1 no longer sets GOTRAIN_JOB_TOKEN first: %q", block[2])
	}
	tok, err := os.ReadFile(got["file"])
	if err != nil {
		t.Fatalf("the line names the token file %s: %v", got["file"], err)
	}
	if st, err := os.Stat(got["file"]); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("token file %s: mode %v, %v; README says 0600", got["file"], st.Mode(), err)
	}
	got["token"] = strings.TrimSpace(string(tok))
	_, args = readmeLoopback(t, strings.TrimPrefix(block[3], "node1$ "), got)
	second := startEnv(t, []string{"GOTRAIN_JOB_TOKEN=" + got["token"]}, args...)
	checkTwoRanks(t, first, second)
}

// `gotrain coordinator` on its own, and the same command on every node.
func TestReadmeSeveralNodesStandalone(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, readmeBlocks(t, "Several nodes"), "head$ ")
	if len(block) != 3 {
		t.Fatalf("README's standalone example changed shape (head$, its line, nodeN$):\n%s", strings.Join(block, "\n"))
	}
	// ~/.gotrain-token's content: README's $(cat ~/.gotrain-token).
	vals := map[string]string{"token": "0123456789abcdef0123456789abcdef"}
	env, args := readmeLoopback(t, strings.TrimPrefix(block[0], "head$ "), vals)
	coord := startEnv(t, env, args...)
	got := waitPrinted(t, coord, printedLine(t, block[1]))
	vals["addr"], vals["hash"] = "127.0.0.1:"+got["port"], got["hash"]
	env, args = readmeLoopback(t, strings.TrimPrefix(block[2], "nodeN$ "), vals)
	a := startEnv(t, env, args...)
	waitOutput(t, coord, "the first node's join", func() bool { return strings.Contains(coord.err.String(), "node_id=node-1") })
	b := startEnv(t, env, args...)
	checkTwoRanks(t, a, b, coord)
	if !strings.Contains(coord.err.String(), "job succeeded") {
		t.Errorf("the coordinator did not report success:\n%s", coord.err.String())
	}
}
