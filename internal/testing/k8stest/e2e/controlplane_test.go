package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// controlPlane is etcd, kube-apiserver and kube-controller-manager (the
// Job and garbage-collector controllers) on 127.0.0.1, each a process of
// its own, started from the binaries `make e2e-kubernetes` built. Clients
// authenticate with a bearer token in system:masters.
type controlPlane struct {
	dir    string
	client kubernetes.Interface
	procs  []*exec.Cmd
}

// startControlPlane starts the three and waits until the API server is
// ready and the default ServiceAccount exists (no ServiceAccount
// controller runs: its admission plugin refuses pods without one).
func startControlPlane(bin, dir string) (cp *controlPlane, err error) {
	cp = &controlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.stop()
			err = fmt.Errorf("%w (logs in %s)", err, dir)
		}
	}()
	token, err := cp.credentials()
	if err != nil {
		return cp, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return cp, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if err := cp.start("etcd", filepath.Join(bin, "etcd"), "--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL); err != nil {
		return cp, err
	}
	if err := waitHTTP(http.DefaultClient, etcdURL+"/health", "", time.Minute); err != nil {
		return cp, fmt.Errorf("etcd: %w", err)
	}
	apiURL := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	certs := filepath.Join(dir, "certs")
	if err := cp.start("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[2]), "--cert-dir", certs,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24", "--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		// On loopback: the default reconciler refuses 127.0.0.1 as the
		// kubernetes Service's endpoint.
		"--endpoint-reconciler-type", "none"); err != nil {
		return cp, err
	}
	cfg := &rest.Config{Host: apiURL, BearerToken: token, QPS: 100, Burst: 200,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(certs, "apiserver.crt")}}
	// The serving certificate is written at start: wait for it, then for
	// /readyz through it.
	if err := waitFile(cfg.TLSClientConfig.CAFile, time.Minute); err != nil {
		return cp, fmt.Errorf("kube-apiserver: %w", err)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return cp, err
	}
	if err := waitHTTP(httpClient, apiURL+"/readyz", token, 2*time.Minute); err != nil {
		return cp, fmt.Errorf("kube-apiserver: %w", err)
	}
	if cp.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return cp, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
`, apiURL, cfg.TLSClientConfig.CAFile, token), 0o600); err != nil {
		return cp, err
	}
	if err := cp.start("kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig", kubeconfig, "--controllers", "job,garbage-collector-controller", "--leader-elect=false",
		"--secure-port", "0"); err != nil {
		return cp, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := cp.client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return cp, fmt.Errorf("create the default ServiceAccount: %w", err)
	}
	return cp, nil
}

// credentials writes the service-account signing key pair and a token
// file with one administrator; it returns the administrator's token.
func (cp *controlPlane) credentials() (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(token + ",admin,admin,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.dir, name), data, 0o600); err != nil {
			return "", err
		}
	}
	return token, nil
}

// start runs one component, its output in dir/NAME.log.
func (cp *controlPlane) start(name, path string, args ...string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s: %w (build it: make e2e-kubernetes)", name, err)
	}
	log, err := os.Create(filepath.Join(cp.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	log.Close() // the child holds it
	cp.procs = append(cp.procs, cmd)
	return nil
}

// stop ends the components, last started first.
func (cp *controlPlane) stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		p := cp.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	cp.procs = nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func waitFile(path string, d time.Duration) error {
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %s", path, d)
		}
	}
}

// waitHTTP waits until url answers 200.
func waitHTTP(c *http.Client, url, token string, d time.Duration) error {
	var last string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = resp.Status
	}
	return fmt.Errorf("%s not ready within %s (last: %s)", url, d, last)
}
