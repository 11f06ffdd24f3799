package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/launcher/placement"
)

// runBounded runs the binary with env added, and fails the test when it
// has not exited within bound: input that can never work must be refused
// before anything waits (a wait here is for --join-timeout, 10 minutes).
func runBounded(t *testing.T, bin string, env []string, bound time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "GOTRAIN_SLURM=off"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gotrain %s still ran after %s: it waits instead of refusing the input\nstderr:\n%s", strings.Join(args, " "), bound, e.String())
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// pemFiles writes a certificate and key of a fresh CA's server certificate
// into dir and returns their paths.
func pemFiles(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	ca, err := jobtls.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.ServerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	var chain []byte
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if err := os.WriteFile(certFile, chain, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// Every malformed --ca-hash, --coordinator, --tls-* file,
// token file and port is a usage error (exit 2, the message and what to
// do), at once, for every command that would otherwise wait on it.
func TestBadInputRefusedBeforeWaiting(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cert, key := pemFiles(t, dir, "site")
	_, otherKey := pemFiles(t, dir, "other")
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate\n"), 0o600)
	openKey := filepath.Join(dir, "open.key")
	b, _ := os.ReadFile(key)
	os.WriteFile(openKey, b, 0o644)
	os.Chmod(openKey, 0o644)
	openToken := filepath.Join(dir, "open.token")
	os.WriteFile(openToken, []byte("0123456789abcdef0123\n"), 0o644)
	os.Chmod(openToken, 0o644)
	emptyToken := filepath.Join(dir, "empty.token")
	os.WriteFile(emptyToken, nil, 0o600)

	hex64 := strings.Repeat("5f0c", 16)
	join := []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--coordinator", "127.0.0.1:29965"}
	withTok := []string{"GOTRAIN_JOB_TOKEN=0123456789abcdef0123"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"README's elided hash", withTok, append(join, "--ca-hash", "sha256:5f0c", "--", "true"), "it has 4 hex digits, not 64"},
		{"elided with …", withTok, append(join, "--ca-hash", "sha256:5f0c…", "--", "true"), "it is cut short (…)"},
		{"no sha256: prefix", withTok, append(join, "--ca-hash", hex64, "--", "true"), `it does not start with "sha256:"`},
		{"not hex", withTok, append(join, "--ca-hash", "sha256:"+strings.Repeat("zz", 32), "--", "true"), "not hex digits"},
		{"too long", withTok, append(join, "--ca-hash", "sha256:"+hex64+"00", "--", "true"), "66 hex digits"},
		{"empty entry in --coordinator", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--coordinator", "127.0.0.1:1,,127.0.0.1:2", "--insecure-skip-ca-check", "--", "true"}, "has an empty entry"},
		{"--coordinator without host", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--coordinator", ":29400", "--insecure-skip-ca-check", "--", "true"}, "has no host"},
		{"--coordinator port 0", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--coordinator", "h:0", "--insecure-skip-ca-check", "--", "true"}, `port "0"`},
		{"--coordinator port 65536", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--coordinator", "h:1,h:65536", "--insecure-skip-ca-check", "--", "true"}, `port "65536"`},
		{"--node-addr with a port", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "10.0.0.1:80", "--", "true"}, `--node-addr "10.0.0.1:80"`},
		{"--tls-ca missing", withTok, append(join, "--tls-ca", filepath.Join(dir, "none.pem"), "--", "true"), "no such file"},
		{"--tls-ca not PEM", withTok, append(join, "--tls-ca", junk, "--", "true"), "holds no PEM certificate"},
		{"--tls-ca a directory", withTok, append(join, "--tls-ca", dir, "--", "true"), "is not a regular file"},
		{"--tls-ca and --ca-hash", withTok, append(join, "--tls-ca", cert, "--ca-hash", "sha256:"+hex64, "--", "true"), "--ca-hash and --tls-ca both given"},
		{"--tls-cert not PEM", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--tls-cert", junk, "--tls-key", key, "--", "true"}, "holds no PEM certificate"},
		{"--tls-key not PEM", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--tls-cert", cert, "--tls-key", junk, "--", "true"}, "holds no PEM private key"},
		{"--tls-key of another certificate", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--tls-cert", cert, "--tls-key", otherKey, "--", "true"}, "is the key the certificate's?"},
		{"--tls-key readable by all", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--tls-cert", cert, "--tls-key", openKey, "--", "true"}, "chmod 600"},
		{"--tls-cert alone", withTok, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--tls-cert", cert, "--", "true"}, "--tls-cert without --tls-key"},
		{"no token to join with", nil, append(join, "--ca-hash", "sha256:"+hex64, "--", "true"), "needs its job token"},
		{"token file readable by all", nil, append(join, "--ca-hash", "sha256:"+hex64, "--job-token-file", openToken, "--", "true"), "chmod 600"},
		{"token file empty", nil, append(join, "--ca-hash", "sha256:"+hex64, "--job-token-file", emptyToken, "--", "true"), "is empty"},
		{"token file missing", nil, append(join, "--ca-hash", "sha256:"+hex64, "--job-token-file", filepath.Join(dir, "none"), "--", "true"), "no such file"},
		{"no such program", nil, []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--", "/no/such/program"}, "program /no/such/program"},
		{"coordinator --tls-cert not PEM", nil, []string{"coordinator", "--listen", "127.0.0.1:0", "--tls-cert", junk, "--tls-key", key}, "holds no PEM certificate"},
		{"coordinator --tls-key of another", nil, []string{"coordinator", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", otherKey}, "is the key the certificate's?"},
		{"coordinator --peers empty entry", withTok, []string{"coordinator", "--listen", "127.0.0.1:1", "--peers", "127.0.0.1:1,,127.0.0.1:3"}, "an empty entry"},
		{"coordinator --peers port 0", withTok, []string{"coordinator", "--listen", "127.0.0.1:1", "--peers", "127.0.0.1:1,127.0.0.1:0,127.0.0.1:3"}, `--peers "127.0.0.1:0": port "0"`},
		{"coordinator token file readable by all", nil, []string{"coordinator", "--listen", "127.0.0.1:0", "--job-token-file", openToken}, "chmod 600"},
		{"diagnose elided hash", withTok, []string{"diagnose", "--coordinator", "127.0.0.1:29965", "--ca-hash", "sha256:5f0c"}, "it has 4 hex digits"},
		{"diagnose --tls-ca not PEM", withTok, []string{"diagnose", "--coordinator", "127.0.0.1:29965", "--tls-ca", junk}, "holds no PEM certificate"},
		{"top elided hash", withTok, []string{"top", "--once", "--coordinator", "127.0.0.1:29965", "--ca-hash", "sha256:5f0c…"}, "cut short"},
		{"top empty entry", withTok, []string{"top", "--once", "--coordinator", "127.0.0.1:1,", "--ca-hash", "sha256:" + hex64}, "has an empty entry"},
		{"torchrun endpoint port", withTok, []string{"torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:70000", "--no-python", "true"}, `port "70000"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runBounded(t, bin, tc.env, time.Minute, tc.args...)
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "Run 'gotrain ") {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 at once, nothing on stdout, stderr with %q and the usage hint", code, stdout, stderr, tc.want)
			}
		})
	}
}

// A coordinator whose CA is not the pinned one is refused at once, and
// the error names both hashes: the pinned one and the one presented.
func TestCoordinatorOfAnotherCARefused(t *testing.T) {
	bin := buildBinary(t)
	fake, err := jobtls.NewCA("fake")
	if err != nil {
		t.Fatal(err)
	}
	real, _ := jobtls.NewCA("real")
	srv, err := fake.ServerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	conf := jobtls.ServerConfig(srv, fake)
	conf.NextProtos = []string{"h2"}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).HandshakeContext(t.Context())
			}(c)
		}
	}()
	addr := lis.Addr().String()
	env := []string{"GOTRAIN_JOB_TOKEN=0123456789abcdef0123"}
	for _, args := range [][]string{
		{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--nnodes", "2", "--node-addr", "127.0.0.1", "--coordinator", addr, "--ca-hash", real.Hash(), "--", "true"},
		{"diagnose", "--coordinator", addr, "--ca-hash", real.Hash()},
		{"top", "--once", "--coordinator", addr, "--ca-hash", real.Hash()},
	} {
		t.Run(args[0], func(t *testing.T) {
			_, stderr, code := runBounded(t, bin, env, time.Minute, args...)
			if code == 0 || !strings.Contains(stderr, "--ca-hash is "+real.Hash()) || !strings.Contains(stderr, "presented "+fake.Hash()) {
				t.Errorf("exit %d, stderr %q; want a failure naming the pinned hash %s and the presented %s", code, stderr, real.Hash(), fake.Hash())
			}
			if strings.Contains(stderr, "waiting for the coordinator") {
				t.Errorf("it waited for a coordinator it can never trust:\n%s", stderr)
			}
		})
	}
}

// On this machine, which has no GPU: --gpus N is an error
// that says what was found and how to run on CPUs; --nproc-per-node N
// without --backend runs on CPUs, saying so; --backend cpu is quiet.
func TestNoGPUMachine(t *testing.T) {
	if g := placement.FindGPUs(); g.N > 0 {
		t.Skipf("this machine has GPUs (%s)", g.How)
	}
	bin := buildBinary(t)
	for _, tc := range []struct {
		args      []string
		code      int
		want, not string
	}{
		{[]string{"launch", "--gpus", "8", "--", "true"}, exitUsage,
			"--gpus 8, but this machine has no NVIDIA GPU (no /dev/nvidia0... device files; no NVIDIA driver found (NVML: ", ""},
		{[]string{"launch", "--gpus", "8", "--", "true"}, exitUsage, "To run on CPUs, pass --backend cpu --nproc-per-node 8.", ""},
		{[]string{"launch", "--gpus", "2", "--backend", "cpu", "--", "true"}, exitUsage, "--gpus 2 with --backend cpu", ""},
		{[]string{"launch", "--backend", "nccl", "--nproc-per-node", "2", "--", "true"}, exitUsage, "--backend nccl, but this machine has no NVIDIA GPU (no /dev/nvidia0...", ""},
		{[]string{"launch", "--", "true"}, exitUsage, "no NVIDIA GPU found on this machine (no /dev/nvidia0...", ""},
		{[]string{"launch", "--nproc-per-node", "2", "--", "true"}, 0, "gotrain: warning: no NVIDIA GPU on this machine (no /dev/nvidia0... device files", ""},
		{[]string{"launch", "--nproc-per-node", "2", "--backend", "cpu", "--", "true"}, 0, "", "warning: no NVIDIA GPU"},
		{[]string{"torchrun", "--nproc-per-node", "gpu", "t.py"}, exitUsage, "no NVIDIA GPUs", ""},
		{[]string{"torchrun", "--nproc-per-node", "2", "--no-python", "true"}, 0, "gotrain torchrun: warning: this machine has no NVIDIA GPU (no /dev/nvidia0...", ""},
		{[]string{"torchrun", "--nproc-per-node", "cpu", "--no-python", "true"}, 0, "", "warning: this machine has no NVIDIA GPU"},
		{[]string{"bench", "allreduce", "--gpus", "2"}, exitFailure, "no NVIDIA GPU on this machine (no /dev/nvidia0...", ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, stderr, code := runBounded(t, bin, nil, 2*time.Minute, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) || tc.not != "" && strings.Contains(stderr, tc.not) {
				t.Errorf("exit %d, stderr %q; want exit %d, stderr with %q and without %q", code, stderr, tc.code, tc.want, tc.not)
			}
		})
	}
}
