package torchrun

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Map turns torchrun's arguments (without "torchrun") into gotrain launch's:
// scan reads the command line as torchrun's argparse does (scan.go), then
// each step below maps one concern onto launch's flags, in launch's order.
func Map(args []string, m Machine) (Result, error) {
	cl, err := scan(args)
	if err != nil {
		return Result{}, err
	}
	mp := &mapping{m: m, cl: cl}
	for _, step := range []func() error{mp.noEffectNotes, mp.workers, mp.nodes, mp.rendezvous, mp.restarts, mp.output, mp.signals} {
		if err := step(); err != nil {
			return Result{}, err
		}
	}
	// gotrain launch's own settings, as GOTRAIN_NAME variables (the way
	// PET_NAME gives torchrun's): after the mapped flags, so that a
	// torchrun flag and a setting never fight over one launch flag.
	mp.out = append(mp.out, settings(m, mp.out, mp.r.Host)...)
	if err := mp.program(); err != nil {
		return Result{}, err
	}
	return mp.r, nil
}

// mapping is one Map call's state: the command line, what has been decided,
// and launch's arguments so far.
type mapping struct {
	m   Machine
	cl  commandLine
	r   Result
	out []string
	// nproc is the workers per node (a number); nnodes launch's --nnodes,
	// maxNodes its largest count, standalone torchrun's --standalone.
	nproc      string
	nnodes     string
	minNodes   int
	maxNodes   int
	standalone bool
}

// get is the flag's value: the command line's, else its PET_ variable's.
func (mp *mapping) get(name string) (string, bool) {
	if v, ok := mp.cl.set[name]; ok {
		return v, true
	}
	if mp.m.Getenv == nil {
		return "", false
	}
	v := mp.m.Getenv("PET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	if v == "" {
		return "", false
	}
	if flags[name] == boolean {
		return strconv.FormatBool(v == "1" || strings.EqualFold(v, "true")), true
	}
	return v, true
}

func (mp *mapping) on(name string) bool { v, _ := mp.get(name); return v == "true" }

func (mp *mapping) note(format string, a ...any) {
	mp.r.Notes = append(mp.r.Notes, fmt.Sprintf(format, a...))
}

func (mp *mapping) add(args ...string) { mp.out = append(mp.out, args...) }

// noEffectNotes notes each flag given that gotrain takes without effect.
func (mp *mapping) noEffectNotes() error {
	noted := map[string]bool{}
	if v, _ := mp.get("nnodes"); v != "" && v != "1" && v != "1:1" {
		noted["rdzv-backend"] = true // on several nodes it decides who runs the coordinator
	}
	for _, name := range flagOrder(mp.cl.given, mp.m.Getenv) {
		why, ok := noEffect[name]
		if !ok || noted[name] || name == "run-path" && !mp.on(name) {
			continue
		}
		noted[name] = true
		if v, _ := mp.get(name); flags[name] == boolean {
			mp.note("--%s has no effect: %s", name, why)
		} else {
			mp.note("--%s %s has no effect: %s", name, v, why)
		}
	}
	return nil
}

// workers maps --nproc-per-node (torchrun's default: 1) and, where the
// workers outnumber the GPUs, the CPU backend with a warning.
func (mp *mapping) workers() error {
	given, _ := mp.get("nproc-per-node")
	n, err := nprocOf(given, mp.m)
	if err != nil {
		return err
	}
	mp.nproc = strconv.Itoa(n)
	mp.add("--nproc-per-node", mp.nproc)
	if mp.m.GPUs > 0 && n <= mp.m.GPUs {
		return nil
	}
	mp.add("--backend", "cpu")
	// torchrun counts processes, not GPUs: the workers run, on gotrain's
	// CPU backend, and the user is told that they get no GPU.
	how := ""
	if mp.m.GPUsHow != "" {
		how = " (" + mp.m.GPUsHow + ")"
	}
	switch {
	case given == "cpu":
	case mp.m.GPUs == 0:
		mp.r.Warnings = append(mp.r.Warnings, fmt.Sprintf("this machine has no NVIDIA GPU%s: the %s worker(s) run on gotrain's CPU backend, with no GPU each (--nproc-per-node cpu says so)", how, mp.nproc))
	default:
		mp.r.Warnings = append(mp.r.Warnings, fmt.Sprintf("--nproc-per-node %s, but this machine has %d NVIDIA GPU(s)%s: the workers run on gotrain's CPU backend, with no GPU each (give %d or fewer for one GPU each)", mp.nproc, mp.m.GPUs, how, mp.m.GPUs))
	}
	return nil
}

// nprocOf reads --nproc-per-node's value ("" for torchrun's default, 1).
func nprocOf(v string, m Machine) (int, error) {
	switch v {
	case "":
		return 1, nil
	case "auto":
		if m.GPUs > 0 {
			return m.GPUs, nil
		}
		return max(m.CPUs, 1), nil
	case "gpu":
		if m.GPUs == 0 {
			return 0, usage("--nproc-per-node gpu, but this machine has no NVIDIA GPUs (give a number, or cpu)")
		}
		return m.GPUs, nil
	case "cpu":
		return max(m.CPUs, 1), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, usage("--nproc-per-node %q: give a positive number, auto, gpu or cpu", v)
	}
	return n, nil
}

// rdzvKeys are the rendezvous flags that a one-node job does without.
var rdzvKeys = []string{"rdzv-endpoint", "master-addr", "master-port", "node-rank", "rdzv-id"}

// nodes maps --nnodes (N or MIN:MAX), --standalone and --rdzv-id.
func (mp *mapping) nodes() error {
	mp.nnodes, mp.minNodes, mp.maxNodes = "1", 1, 1
	if v, ok := mp.get("nnodes"); ok {
		lo, hi, elastic := strings.Cut(v, ":")
		var err1, err2 error
		mp.minNodes, err1 = strconv.Atoi(lo)
		mp.maxNodes = mp.minNodes
		if elastic {
			mp.maxNodes, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || mp.minNodes < 1 || mp.maxNodes < mp.minNodes {
			return usage("--nnodes %q: give N or MIN:MAX with 1 <= MIN <= MAX", v)
		}
		mp.nnodes = v
	}
	mp.standalone = mp.on("standalone")
	if mp.standalone {
		switch {
		case mp.minNodes > 1:
			return usage("--standalone runs one node, but --nnodes is %s: no other node can join a standalone rendezvous", mp.nnodes)
		case mp.maxNodes > 1:
			// torchrun's standalone rendezvous is at localhost:0, where no
			// other node finds it: the job is this node's alone.
			mp.note("--nnodes %s has no effect with --standalone: no other node can join, so this node runs the job alone", mp.nnodes)
			mp.nnodes, mp.maxNodes = "1", 1
		}
		for _, k := range rdzvKeys {
			if v, ok := mp.get(k); ok && k != "rdzv-id" {
				mp.note("--%s %s has no effect with --standalone: gotrain starts its own coordinator on this node", k, v)
			}
		}
	}
	if mp.nnodes != "1" {
		mp.add("--nnodes", mp.nnodes)
	}
	if v, ok := mp.get("rdzv-id"); ok && v != "" && v != "none" {
		mp.add("--run-id", v)
	}
	return nil
}

// rendezvous decides, as torchrun decides who hosts its store, whether this
// node runs the coordinator or joins it, and where.
func (mp *mapping) rendezvous() error {
	if mp.standalone {
		return nil
	}
	nodeRank, hasRank := mp.get("node-rank")
	if hasRank {
		if n, err := strconv.Atoi(nodeRank); err != nil || n < 0 {
			return usage("--node-rank %q: give 0 or more", nodeRank)
		}
	}
	endpoint, setEndpoint := mp.get("rdzv-endpoint")
	addr, hasAddr := mp.get("master-addr")
	port, hasPort := mp.get("master-port")
	hasEndpoint := setEndpoint
	if !setEndpoint && (hasAddr || hasPort) {
		endpoint, hasEndpoint = net.JoinHostPort(orDefault(addr, "127.0.0.1"), orDefault(port, "29500")), true
	}
	switch {
	case mp.maxNodes == 1:
		mp.oneNode(!setEndpoint && hasPort, port)
	case hasEndpoint:
		return mp.meetAt(endpoint, setEndpoint, nodeRank, hasRank)
	case hasRank:
		mp.note("--node-rank %s has no effect without a rendezvous endpoint (--rdzv-endpoint or --master-addr)", nodeRank)
	}
	return nil
}

// orDefault is v, or def when v is empty.
func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// oneNode notes the rendezvous flags a one-node job does without; a
// --master-port (storePort) becomes rank 0's TCPStore port, as torchrun's
// agent store and MASTER_PORT are there.
func (mp *mapping) oneNode(storePort bool, port string) {
	for _, k := range rdzvKeys {
		if k == "master-port" && storePort {
			mp.add("--store-port", port)
			continue
		}
		if v, ok := mp.get(k); ok && k != "rdzv-id" {
			mp.note("--%s %s has no effect on one node: gotrain starts its own coordinator here, and workers see its MASTER_ADDR and MASTER_PORT", k, v)
		}
	}
}

// meetAt maps a multi-node line meeting at endpoint. Who runs the
// coordinator: with the static backend (torchrun's default, and any
// --master-addr line), node rank 0; with c10d, the node the endpoint's host
// names, unless its port is taken already (a second node on the same
// machine), which then joins.
func (mp *mapping) meetAt(endpoint string, setEndpoint bool, nodeRank string, hasRank bool) error {
	host, p, err := net.SplitHostPort(endpoint)
	if err != nil { // HOST alone: torchrun's default port
		host, p = endpoint, "29400"
	}
	loopback := isLoopback(host)
	listen := net.JoinHostPort("0.0.0.0", p)
	if loopback {
		listen = net.JoinHostPort("127.0.0.1", p)
	}
	backend, _ := mp.get("rdzv-backend")
	switch backend {
	case "", "static", "c10d":
	case "etcd", "etcd-v2":
		return usage("--rdzv-backend %s: gotrain does not speak to etcd; give --rdzv-backend c10d --rdzv-endpoint HOST:PORT of the node that should run the coordinator (nothing else needs to run there)", backend)
	default:
		return usage("--rdzv-backend %q: give c10d or static", backend)
	}
	static := backend == "static" || (backend == "" && !setEndpoint)
	here := mp.hostsCoordinator(static, hasRank, nodeRank, host, listen)
	mp.r.Host = here
	if !mp.m.HasSecret {
		switch {
		case !loopback:
			return fmt.Errorf("%w: a job of %s nodes meeting at %s, and no secret was given: gotrain will not run a job that anyone who reaches %s can join", ErrNoSecret, mp.nnodes, endpoint, net.JoinHostPort(host, p))
		case !here:
			mp.r.LocalToken = p
		}
	}
	switch {
	case here && static:
		mp.add("--coordinator-listen", listen)
		mp.note("node rank 0 starts the coordinator at port %s", p)
	case here:
		mp.add("--coordinator-listen", listen)
		mp.note("%s names this machine: the coordinator starts here, at port %s", host, p)
	default:
		mp.add("--coordinator", net.JoinHostPort(host, p))
		if hasRank && static {
			// The node order follows it, after the coordinator's node.
			mp.add("--node-rank", nodeRank)
		}
	}
	return nil
}

// hostsCoordinator says whether this node runs the coordinator.
func (mp *mapping) hostsCoordinator(static, hasRank bool, nodeRank, host, listen string) bool {
	if static && hasRank {
		return nodeRank == "0"
	}
	// c10d, or a static line without a node rank.
	isLocal, canListen := mp.m.IsLocal, mp.m.CanListen
	if isLocal == nil {
		isLocal = isLoopback
	}
	if canListen == nil {
		canListen = func(string) bool { return true }
	}
	return isLocal(host) && canListen(listen)
}

// restarts maps --max-restarts (torchrun's default: 0).
func (mp *mapping) restarts() error {
	restarts := "0"
	if v, ok := mp.get("max-restarts"); ok {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			return usage("--max-restarts %q: give 0 or more", v)
		}
		restarts = v
	}
	mp.add("--max-restarts", restarts)
	return nil
}

// output maps --log-dir, how the output is printed (outputFlags) and
// --role.
func (mp *mapping) output() error {
	logDir, _ := mp.get("log-dir")
	if logDir != "" {
		mp.add("--log-dir", logDir)
	}
	shown, needLogDir := outputFlags(mp.get, mp.nproc == "1" && mp.maxNodes == 1)
	mp.add(shown...)
	mp.r.TempLogDir = needLogDir && logDir == ""
	if v, ok := mp.get("role"); ok && v != "" {
		mp.add("--role", v)
	}
	return nil
}

// signals maps --signals-to-handle: SIGINT and SIGTERM always stop the
// workers; the others gotrain can pass on are kept.
func (mp *mapping) signals() error {
	v, ok := mp.get("signals-to-handle")
	if !ok {
		return nil
	}
	var keep []string
	for _, s := range strings.Split(v, ",") {
		s = strings.ToUpper(strings.TrimSpace(s))
		if !strings.HasPrefix(s, "SIG") {
			s = "SIG" + s
		}
		switch {
		case s == "SIGINT" || s == "SIGTERM":
		case forwardable[s]:
			keep = append(keep, s)
		default:
			return usage("--signals-to-handle: %s cannot be passed on: choose among SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2", s)
		}
	}
	mp.add("--signals-to-handle", orDefault(strings.Join(keep, ","), "none"))
	return nil
}

// program ends launch's arguments with the program: torchrun runs python
// -u SCRIPT, python -u -m MODULE, or (--no-python) the program itself.
func (mp *mapping) program() error {
	python := orDefault(mp.m.Python, "python3")
	mp.add("--")
	switch {
	case mp.on("no-python") && mp.on("module"):
		return usage("-m and --no-python cannot be used together")
	case mp.on("no-python"):
		mp.add(mp.cl.script)
	case mp.on("module"):
		mp.add(python, "-u", "-m", mp.cl.script)
		mp.r.Python = true
	default:
		mp.add(python, "-u", mp.cl.script)
		mp.r.Python = true
	}
	mp.r.LaunchArgs = append(mp.out, mp.cl.scriptArgs...)
	return nil
}
