package torchrun

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestMap(t *testing.T) {
	cpu := Machine{CPUs: 16}
	gpu := Machine{GPUs: 8, CPUs: 64, HasSecret: true}
	for _, tc := range []struct {
		name  string
		args  string
		m     Machine
		env   map[string]string
		want  string // gotrain launch's arguments
		notes []string
		// tempLogDir: the line needs a log dir it does not name.
		tempLogDir bool
	}{
		{name: "defaults: one worker, no restarts", args: "train.py", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw -- python3 -u train.py"},
		{name: "underscore spelling, =value", args: "--nproc_per_node=2 --standalone train.py --epochs 3", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 -- python3 -u train.py --epochs 3"},
		{name: "dash spelling, value apart", args: "--nproc-per-node 4 train.py", m: gpu,
			want: "--nproc-per-node 4 --max-restarts 0 -- python3 -u train.py"},
		{name: "auto with GPUs", args: "--nproc-per-node auto train.py", m: gpu,
			want: "--nproc-per-node 8 --max-restarts 0 -- python3 -u train.py"},
		{name: "auto without GPUs: the CPUs", args: "--nproc-per-node=auto train.py", m: cpu,
			want: "--nproc-per-node 16 --backend cpu --max-restarts 0 -- python3 -u train.py"},
		{name: "gpu", args: "--nproc-per-node gpu train.py", m: gpu,
			want: "--nproc-per-node 8 --max-restarts 0 -- python3 -u train.py"},
		{name: "cpu on a GPU machine", args: "--nproc-per-node cpu train.py", m: gpu,
			want: "--nproc-per-node 64 --backend cpu --max-restarts 0 -- python3 -u train.py"},
		{name: "-m module", args: "--nproc_per_node 2 -m pkg.train --lr 1", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 -- python3 -u -m pkg.train --lr 1"},
		{name: "--no-python", args: "--no-python --nproc-per-node 2 ./train x", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 -- ./train x"},
		{name: "script flags stay the script's", args: "--max_restarts 3 train.py --nproc_per_node 9 --bogus", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 3 --output raw -- python3 -u train.py --nproc_per_node 9 --bogus"},
		{name: "argparse abbreviations", args: "--nproc=2 --max_r 3 --stand t.py", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 3 -- python3 -u t.py"},
		{name: "-- before the script", args: "--nproc-per-node 2 -- train.py", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 -- python3 -u train.py"},
		{name: "elastic nodes with an endpoint", args: "--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id job7 train.py", m: gpu,
			want:  "--nproc-per-node 1 --nnodes 1:2 --run-id job7 --coordinator head:29400 --max-restarts 0 -- python3 -u train.py",
			notes: []string{}},
		{name: "node rank 0 listens at the master port", args: "--nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 train.py", m: gpu,
			want:  "--nproc-per-node 1 --nnodes 2 --coordinator-listen 0.0.0.0:29500 --max-restarts 0 -- python3 -u train.py",
			notes: []string{"node rank 0 starts the coordinator at port 29500"}},
		{name: "node rank 1 joins the master", args: "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 train.py", m: gpu,
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 10.0.0.1:29500 --node-rank 1 --max-restarts 0 -- python3 -u train.py"},
		{name: "standalone drops the rendezvous", args: "--standalone --rdzv-endpoint x:1 --master-port 5 t.py", m: cpu,
			want:  "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw -- python3 -u t.py",
			notes: []string{"--rdzv-endpoint x:1 has no effect with --standalone", "--master-port 5 has no effect with --standalone"}},
		{name: "master address on one node", args: "--master-addr 127.0.0.1 --master-port 29501 t.py", m: cpu,
			want:  "--nproc-per-node 1 --backend cpu --store-port 29501 --max-restarts 0 --output raw -- python3 -u t.py",
			notes: []string{"--master-addr 127.0.0.1 has no effect on one node"}},
		{name: "log dir, output, no-effect flags", args: "--log-dir /tmp/l --redirects 3 --tee 3 --local-ranks-filter 0 --role trainer --monitor-interval 0.1 --rdzv-conf join_timeout=5 t.py", m: cpu,
			want:  "--nproc-per-node 1 --backend cpu --max-restarts 0 --log-dir /tmp/l --redirects 3 --console-ranks 0 --role trainer -- python3 -u t.py",
			notes: []string{"--monitor-interval 0.1 has no effect", "--rdzv-conf join_timeout=5 has no effect"}},
		{name: "per-rank redirects, two ranks", args: "--nproc-per-node 2 --redirects 0:1,1:3 t.py", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 --redirects 0:1,1:3 -- python3 -u t.py", tempLogDir: true},
		{name: "tee without a log dir, one rank: prefixed", args: "--tee 1 t.py", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 0 -- python3 -u t.py", tempLogDir: true},
		{name: "torchrun's -r and -t", args: "--nproc-per-node 2 -r 0:1 -t3 --log-dir /l t.py", m: cpu,
			want: "--nproc-per-node 2 --backend cpu --max-restarts 0 --log-dir /l --redirects 0:1 -- python3 -u t.py"},
		{name: "standalone and elastic nodes: this node alone", args: "--standalone --nnodes=1:2 t.py", m: cpu,
			want:  "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw -- python3 -u t.py",
			notes: []string{"--nnodes 1:2 has no effect with --standalone"}},
		{name: "tee 0 is none", args: "--tee 0 t.py", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw -- python3 -u t.py"},
		{name: "signals: SIGTERM and SIGINT always", args: "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGUSR1 t.py", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw --signals-to-handle SIGHUP,SIGUSR1 -- python3 -u t.py"},
		{name: "signals: none left", args: "--signals_to_handle=SIGTERM t.py", m: cpu,
			want: "--nproc-per-node 1 --backend cpu --max-restarts 0 --output raw --signals-to-handle none -- python3 -u t.py"},
		{name: "PET_ variables are defaults", args: "--max-restarts 1 t.py", m: cpu,
			env:  map[string]string{"PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "9", "PET_STANDALONE": "1", "PET_TEE": "3"},
			want: "--nproc-per-node 3 --backend cpu --max-restarts 1 -- python3 -u t.py", tempLogDir: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			m.Getenv = func(k string) string { return tc.env[k] }
			r, err := Map(strings.Fields(tc.args), m)
			if err != nil {
				t.Fatalf("Map(%s): %v", tc.args, err)
			}
			if got := strings.Join(r.LaunchArgs, " "); got != tc.want {
				t.Errorf("Map(%s)\n got %s\nwant %s", tc.args, got, tc.want)
			}
			if r.TempLogDir != tc.tempLogDir {
				t.Errorf("TempLogDir %v, want %v", r.TempLogDir, tc.tempLogDir)
			}
			if len(r.Notes) != len(tc.notes) {
				t.Fatalf("notes %q, want %d like %q", r.Notes, len(tc.notes), tc.notes)
			}
			for i, n := range tc.notes {
				if !strings.Contains(r.Notes[i], n) {
					t.Errorf("note %d = %q, want it to contain %q", i, r.Notes[i], n)
				}
			}
		})
	}
}

func TestMapErrors(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"", "no training script"},
		{"--nproc-per-node 2", "no training script"},
		{"--bogus 1 t.py", "flag provided but not defined: -bogus"},
		{"-x t.py", "not defined: -x"},
		{"--nproc-per-node", "needs a value"},
		{"--log-dir --nproc 2 t.py", "--log-dir needs a value"},
		{"--nproc-per-node zero t.py", "give a positive number"},
		{"--nproc-per-node 0 t.py", "give a positive number"},
		{"--nproc-per-node gpu t.py", "no NVIDIA GPUs"},
		{"--nnodes 3:2 t.py", "MIN:MAX"},
		{"--standalone --nnodes 2 t.py", "--standalone runs one node"},
		{"--standalone=1 t.py", "takes no value"},
		{"--max-restarts -1 t.py", "give 0 or more"},
		{"--signals-to-handle SIGKILL t.py", "SIGKILL cannot be passed on"},
		{"-m --no-python x", "cannot be used together"},
		{"--rdzv x t.py", "--rdzv is ambiguous: it could be --rdzv-backend, --rdzv-conf, --rdzv-endpoint, --rdzv-id"},
		{"--numa-binding node t.py", "--numa-binding (torchrun 2.x) is not supported: gotrain pins"},
		{"--virtual_local_rank t.py", "--virtual-local-rank (torchrun 2.x) is not supported"},
		{"--numa node t.py", "--numa-binding (torchrun 2.x) is not supported"},
	} {
		_, err := Map(strings.Fields(tc.args), Machine{CPUs: 2})
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Map(%q) = %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}

// Every flag torchrun documents is known in both spellings.
func TestBothSpellings(t *testing.T) {
	for _, name := range sortedFlags() {
		for _, spelling := range []string{name, strings.ReplaceAll(name, "-", "_")} {
			args := []string{"--" + spelling}
			if flags[name] == valued {
				args = append(args, "1")
			}
			_, err := Map(append(args, "t.py"), Machine{CPUs: 2})
			if err != nil && strings.Contains(err.Error(), "not defined") {
				t.Errorf("--%s: %v", spelling, err)
			}
		}
	}
	if !slices.Contains(sortedFlags(), "nproc-per-node") {
		t.Fatal("no nproc-per-node")
	}
}

// Workers that get no GPU are warned about, except when asked for CPUs.
func TestMapWarnsOfNoGPU(t *testing.T) {
	for _, tc := range []struct {
		args string
		m    Machine
		want string // "" for no warning
	}{
		{"--nproc-per-node 2 t.py", Machine{CPUs: 4, GPUsHow: "no /dev/nvidia0..."}, "this machine has no NVIDIA GPU (no /dev/nvidia0...): the 2 worker(s) run on gotrain's CPU backend"},
		{"--nproc-per-node auto t.py", Machine{CPUs: 4}, "the 4 worker(s) run on gotrain's CPU backend"},
		{"--nproc-per-node 16 t.py", Machine{GPUs: 8, CPUs: 64}, "--nproc-per-node 16, but this machine has 8 NVIDIA GPU(s): the workers run on gotrain's CPU backend"},
		{"--nproc-per-node cpu t.py", Machine{CPUs: 4}, ""},
		{"--nproc-per-node 8 t.py", Machine{GPUs: 8, CPUs: 64}, ""},
	} {
		r, err := Map(strings.Fields(tc.args), tc.m)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(r.Warnings, "\n")
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%s on %+v: warnings %q, want %q", tc.args, tc.m, got, tc.want)
		}
	}
}

// Who runs the coordinator, as torchrun decides who hosts its store, and
// what a line without a shared secret may do.
func TestMapRendezvous(t *testing.T) {
	local := func(hosts ...string) func(string) bool {
		return func(h string) bool { return slices.Contains(hosts, h) }
	}
	taken := func(addrs ...string) func(string) bool {
		return func(a string) bool { return !slices.Contains(addrs, a) }
	}
	const tail = " --max-restarts 0 -- /usr/bin/python3 -u t.py"
	for _, tc := range []struct {
		name, args string
		m          Machine
		want       string // gotrain launch's arguments before tail
		host       bool
		localToken string
		err        error // ErrNoSecret or ErrUsage
		errText    string
	}{
		{name: "c10d endpoint naming this host: the coordinator here, every interface",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 t.py",
			m:    Machine{IsLocal: local("10.0.0.1"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator-listen 0.0.0.0:29400", host: true},
		{name: "c10d endpoint of another host: join it",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 t.py",
			m:    Machine{IsLocal: local("10.0.0.2"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 10.0.0.1:29400"},
		{name: "c10d endpoint without a port: torchrun's 29400",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=head t.py",
			m:    Machine{IsLocal: local("head"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator-listen 0.0.0.0:29400", host: true},
		{name: "c10d endpoint of this host whose port is taken: a second node here joins",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 t.py",
			m:    Machine{IsLocal: local("10.0.0.1"), CanListen: taken("0.0.0.0:29400"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 10.0.0.1:29400"},
		{name: "c10d node rank is not the static one: the endpoint's host decides",
			args: "--nnodes=2 --node_rank=1 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 t.py",
			m:    Machine{IsLocal: local("10.0.0.1"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator-listen 0.0.0.0:29400", host: true},
		{name: "static: node rank 0 runs it wherever --master-addr points",
			args: "--nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 t.py",
			m:    Machine{HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator-listen 0.0.0.0:29500", host: true},
		{name: "static: node rank 1 joins in its place",
			args: "--nnodes=2 --node_rank=1 --master_addr=10.0.0.1 --master_port=29500 t.py",
			m:    Machine{IsLocal: local("10.0.0.1"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 10.0.0.1:29500 --node-rank 1"},
		{name: "loopback endpoint, no secret: the coordinator's node makes the token",
			args: "--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=localhost:29400 t.py",
			m:    Machine{},
			want: "--nproc-per-node 1 --nnodes 1:2 --coordinator-listen 127.0.0.1:29400", host: true},
		{name: "loopback endpoint, no secret, port taken: the token of this user's coordinator here",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29400 t.py",
			m:    Machine{CanListen: taken("127.0.0.1:29400")},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 127.0.0.1:29400", localToken: "29400"},
		{name: "loopback endpoint with a secret: nothing to look up",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29400 t.py",
			m:    Machine{CanListen: taken("127.0.0.1:29400"), HasSecret: true},
			want: "--nproc-per-node 1 --nnodes 2 --coordinator 127.0.0.1:29400"},
		{name: "across machines without a secret: refused on the coordinator's node",
			args: "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 t.py",
			m:    Machine{IsLocal: local("10.0.0.1")}, err: ErrNoSecret, errText: "anyone who reaches 10.0.0.1:29400 can join"},
		{name: "across machines without a secret: refused on a joiner",
			args: "--nnodes=2 --node_rank=1 --master_addr=10.0.0.1 t.py",
			m:    Machine{}, err: ErrNoSecret, errText: "a job of 2 nodes meeting at 10.0.0.1:29500"},
		{name: "etcd: refused with what to give instead",
			args: "--nnodes=2 --rdzv_backend=etcd --rdzv_endpoint=10.0.0.1:2379 t.py",
			m:    Machine{HasSecret: true}, err: ErrUsage, errText: "gotrain does not speak to etcd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			m.CPUs, m.GPUs, m.Python = 8, 8, "/usr/bin/python3"
			r, err := Map(strings.Fields(tc.args), m)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Map(%s) = %v, want %v with %q", tc.args, err, tc.err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Map(%s): %v", tc.args, err)
			}
			if got := strings.Join(r.LaunchArgs, " "); got != tc.want+tail {
				t.Errorf("Map(%s)\n got %s\nwant %s", tc.args, got, tc.want+tail)
			}
			if r.Host != tc.host || r.LocalToken != tc.localToken || !r.Python {
				t.Errorf("Map(%s): Host %v, LocalToken %q, Python %v; want %v, %q, true", tc.args, r.Host, r.LocalToken, r.Python, tc.host, tc.localToken)
			}
		})
	}
}

// gotrain launch's settings come from GOTRAIN_NAME variables, except those
// torchrun's flags give and those gotrain sets in every worker.
func TestMapSettings(t *testing.T) {
	env := map[string]string{
		"GOTRAIN_CA_HASH": "sha256:ab", "GOTRAIN_VERBOSE": "1", "GOTRAIN_HANG_TIMEOUT": "30s",
		"GOTRAIN_BACKEND": "cpu", "GOTRAIN_STANDBY": "1", "GOTRAIN_RUN_ID": "x", "GOTRAIN_MAX_RESTARTS": "7",
		"GOTRAIN_JOB_TOKEN_FILE": "/s/tok",
	}
	m := Machine{CPUs: 2, GPUs: 2, Getenv: func(k string) string { return env[k] },
		LaunchFlags: map[string]bool{"ca-hash": false, "verbose": true, "hang-timeout": false, "backend": false,
			"standby": false, "run-id": false, "max-restarts": false, "job-token-file": false, "no-gossip": true}}
	r, err := Map([]string{"--no-python", "./train"}, m)
	if err != nil {
		t.Fatal(err)
	}
	want := "--nproc-per-node 1 --max-restarts 0 --output raw --ca-hash=sha256:ab --hang-timeout=30s --job-token-file=/s/tok --verbose=true -- ./train"
	if got := strings.Join(r.LaunchArgs, " "); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if r.Python {
		t.Error("--no-python: Python = true")
	}
}
