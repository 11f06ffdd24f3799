# Kill -> first training step after the resume, of an unchanged program,
# under gotrain torchrun and torchrun side by side (interleaved runs).
#
#   python3 bench/real_restart.py --runs 3 --ready 'Epoch 5 ' --resumed Resuming --step '\] Epoch' \
#       --cwd DIR -- multinode.py 100000 1
#
# Each run starts the program under the launcher (one rank, --max-restarts 3),
# waits for the --ready line, SIGKILLs the rank's process (the one whose
# command line runs the program, not a launcher), and times from the kill
# to the first --step line after it. Prints one "result" line per run and a
# summary per launcher; exit 1 if a run did not recover.
import argparse, os, re, signal, subprocess, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--ready", required=True, help="regex of the line after which the rank is killed")
ap.add_argument("--resumed", required=True, help="regex of the line the restarted program prints when it resumed")
ap.add_argument("--step", required=True, help="regex of a training step's line (the first one after --resumed counts)")
ap.add_argument("--cwd", default=".")
ap.add_argument("--gotrain", default=os.path.abspath("bin/gotrain"))
ap.add_argument("--python", default=sys.executable)
ap.add_argument("--launchers", default="gotrain,torchrun")
ap.add_argument("--timeout", type=float, default=120)
ap.add_argument("--clean", default="", help="files to remove in --cwd before each run (its checkpoints)")
ap.add_argument("prog", nargs=argparse.REMAINDER)
a = ap.parse_args()
prog = a.prog[1:] if a.prog and a.prog[0] == "--" else a.prog
script = prog[0]


def command(launcher):
    if launcher == "gotrain":
        return [a.gotrain, "torchrun", "--nproc_per_node", "1", "--max_restarts", "3", *prog]
    torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
    return [a.python, torchrun, "--standalone", "--nproc_per_node", "1", "--max_restarts", "3", *prog]


def rank_pids(root):
    """Descendants of root whose command line runs the program itself."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        kids.setdefault(ppid, []).append((int(p), argv))
    out, todo = [], [root]
    while todo:
        for pid, argv in kids.get(todo.pop(), []):
            todo.append(pid)
            joined = " ".join(argv)
            if any(x.endswith(os.path.basename(script)) for x in argv) and "torchrun" not in joined and "gotrain" not in os.path.basename(argv[0]):
                out.append(pid)
    return out


def run(launcher, i):
    for f in a.clean.split(","):
        if f:
            subprocess.run(["rm", "-rf", os.path.join(a.cwd, f)])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen(command(launcher), cwd=a.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    cond = threading.Condition()

    def reader():
        for line in p.stdout:
            with cond:
                lines.append((time.perf_counter(), line.rstrip("\n")))
                cond.notify_all()
        with cond:
            lines.append((time.perf_counter(), None))
            cond.notify_all()

    threading.Thread(target=reader, daemon=True).start()

    def wait_for(rx, since, deadline):
        with cond:
            while True:
                for t, l in lines[since:]:
                    if l is None:
                        return None, None
                    if re.search(rx, l):
                        return t, lines.index((t, l))
                if not cond.wait(timeout=max(0, deadline - time.perf_counter())):
                    return None, None

    t0 = time.perf_counter()
    got = None
    try:
        tr, idx = wait_for(a.ready, 0, t0 + a.timeout)
        if tr is None:
            print("run %s %d: never ready; last lines:\n  %s" % (launcher, i, "\n  ".join(str(l) for _, l in lines[-15:])))
            return None
        pids = rank_pids(p.pid)
        if len(pids) != 1:
            print("run %s %d: found rank processes %s" % (launcher, i, pids))
            return None
        kill_at = time.perf_counter()
        os.kill(pids[0], signal.SIGKILL)
        with cond:
            after = len(lines)
        # Lines read after the kill may have been written before it: the
        # step that counts is the first after the restarted program's
        # resume line.
        _, ridx = wait_for(a.resumed, after, kill_at + a.timeout)
        ts = None
        if ridx is not None:
            ts, _ = wait_for(a.step, ridx + 1, kill_at + a.timeout)
        if ts is None:
            print("run %s %d: no step after the kill; last lines:\n  %s" % (launcher, i, "\n  ".join(str(l) for _, l in lines[-25:])))
            return None
        got = ts - kill_at
        print("result launcher=%s run=%d kill_to_first_step=%.3f s" % (launcher, i, got), flush=True)
        recovered = [l for _, l in lines if l and "gotrain: recovered" in l]
        for l in recovered[-1:]:
            print("  " + l)
        return got
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


results = {l: [] for l in a.launchers.split(",")}
for i in range(a.runs):
    for l in results:
        results[l].append(run(l, i))
ok = True
for l, rs in results.items():
    good = sorted(r for r in rs if r is not None)
    ok = ok and len(good) == len(rs)
    if good:
        print("summary launcher=%s runs=%d recovered=%d median=%.3f s min=%.3f s max=%.3f s" % (l, len(rs), len(good), good[len(good) // 2], good[0], good[-1]))
    else:
        print("summary launcher=%s runs=%d recovered=0" % (l, len(rs)))
sys.exit(0 if ok else 1)
