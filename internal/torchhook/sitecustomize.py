# gotrain's sitecustomize (internal/torchhook). The agent puts it on its
# workers' PYTHONPATH; the interpreter imports it at start-up, before the
# program. It does two things:
#
# 1. It runs the sitecustomize it shadows (the next one on sys.path, such as
#    Debian's), so the machine's own start-up hook still runs.
# 2. When GOTRAIN_TORCH_PROGRESS_DIR is set and the program uses
#    torch.distributed on a gloo default process group, it counts the
#    collectives of that group: each torch.distributed collective call, and
#    each backward pass of a DistributedDataParallel output that all-reduces
#    the gradients (DDP itself unchanged: the pass counts from when it
#    reaches the output until DDP's wait for its buckets is over). The counts go to
#    DIR/PID.progress, a small memory-mapped record the agent reads each
#    second (layout in torchhook.go), so a rank that stops calling
#    collectives is named like a Go worker that does.
# 3. It times the program's recovery for the agent (internal/launcher/recovery), in
#    DIR/PID.phases, JSON lines: init_process_group's start and end, the
#    first collective completed after it and after each phase the program
#    reports, and those phases: sys.modules["_gotrain_hook"].phase(name,
#    seconds, **facts), which the snapshot module calls after a restore
#    (phase("restore", seconds, bytes=N, source="agent", step=S)). Once,
#    after init_process_group (or 30 s after torch.distributed was
#    imported), it writes the installed packages the program imported,
#    which the agent's Python standbys import ahead of the next attempt.
#
# 4. It arms faulthandler on a real-time signal (SIGRTMIN+6: SIGUSR1 and
#    SIGUSR2 are taken by Slurm's --signal, Lightning's requeue and
#    submitit): every thread's Python stack goes to DIR/PID.stacks, whose
#    first line names the signal, when the agent sends it for a hang or
#    straggler verdict. faulthandler writes from its C signal handler, so a
#    rank stuck in C with the GIL held still answers. Not armed when the
#    signal already has a handler.
#
# Nothing is imported or patched before the program imports torch; a
# failure in the hook turns the hook off and never reaches the program.
# Standard library only.


def _gotrain_sitecustomize():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))

    def chain():
        import importlib.machinery
        import importlib.util

        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_gotrain_shadowed_sitecustomize"] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # what site.py does with a failing sitecustomize
            print("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s" % (type(e).__name__, e), file=sys.stderr)

    chain()
    out = os.environ.get("GOTRAIN_TORCH_PROGRESS_DIR")
    if not out:
        return

    import mmap
    import struct
    import threading
    import time

    def arm_stacks():
        import faulthandler
        import signal

        sig = signal.SIGRTMIN + 6
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            return
        path = os.path.join(out, "%d.stacks" % os.getpid())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        f = os.fdopen(fd, "w", buffering=1)
        f.write("gotrain python stacks: signal %d\n" % int(sig))
        f.flush()
        faulthandler.register(sig, file=f, all_threads=True, chain=False)  # it keeps f open

    try:
        arm_stacks()
    except Exception:
        pass

    # The record: little-endian, 256 bytes (torchhook.go's layout).
    MAGIC = b"GTHOOK1\n"
    RING = 16
    # magic version entered completed completed_ns wait_ns pending_ns pending_op last_op ring[16]
    RECORD = struct.Struct("<8sQqqqqqII%dq" % RING)
    STEPS = struct.Struct("<qq")  # at 192: steps step_ns
    VERSION = struct.Struct("<Q")
    SIZE = 256
    OPS = ("allreduce", "broadcast", "allgather", "reducescatter", "barrier", "alltoall", "reduce", "gather", "scatter")
    CALLS = {
        "all_reduce": "allreduce", "all_reduce_coalesced": "allreduce",
        "broadcast": "broadcast", "broadcast_object_list": "broadcast",
        "all_gather": "allgather", "all_gather_object": "allgather", "all_gather_into_tensor": "allgather",
        "all_gather_coalesced": "allgather", "_all_gather_base": "allgather",
        "reduce_scatter": "reducescatter", "reduce_scatter_tensor": "reducescatter", "_reduce_scatter_base": "reducescatter",
        "barrier": "barrier", "monitored_barrier": "barrier",
        "all_to_all": "alltoall", "all_to_all_single": "alltoall",
        "reduce": "reduce", "gather": "gather", "gather_object": "gather",
        "scatter": "scatter", "scatter_object_list": "scatter",
    }

    class Counter:
        """The default group's collectives of this process, in its record."""

        def __init__(self):
            self.lock = threading.Lock()
            self.map = None
            self.off = False
            self.entered = 0
            self.open = {}  # seq -> (op code, entered ns) of collectives not completed
            self.done = 0  # completed, in any order
            self.completed_ns = 0
            self.wait_ns = 0
            self.ring = [0] * RING
            self.steps = 0
            self.step_ns = 0
            self.version = 0
            self.last_op = 0
            self.tls = threading.local()  # depth: a collective inside a counted one is not counted again

        def record(self):
            if self.map is None:
                path = os.path.join(out, "%d.progress" % os.getpid())
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                try:
                    os.ftruncate(fd, SIZE)
                    self.map = mmap.mmap(fd, SIZE)
                finally:
                    os.close(fd)
            return self.map

        def publish(self):
            # A seqlock: the version is odd while the fields change, so the
            # agent never takes half of an update.
            m = self.record()
            completed = min(self.open) - 1 if self.open else self.entered
            pending_ns, pending_op = 0, 0
            if self.open:
                pending_op, pending_ns = self.open[completed + 1]
            self.version += 1
            VERSION.pack_into(m, 8, self.version)
            RECORD.pack_into(m, 0, MAGIC, self.version, self.entered, completed, self.completed_ns, self.wait_ns, pending_ns, pending_op, self.last_op, *self.ring)
            STEPS.pack_into(m, 192, self.steps, self.step_ns)
            self.version += 1
            VERSION.pack_into(m, 8, self.version)

        def enter(self, op):
            with self.lock:
                self.entered += 1
                seq = self.entered
                code = OPS.index(op) + 1
                self.open[seq] = (code, time.time_ns())
                self.last_op = code
                self.publish()
                return seq

        def complete(self, seq):
            with self.lock:
                item = self.open.pop(seq, None)
                if item is None:
                    return
                now = time.time_ns()
                quietly(facts.completed, now)
                self.done += 1
                self.completed_ns = now
                self.wait_ns += now - item[1]
                self.ring[seq % RING] = now - item[1]
                self.publish()

        def stepped(self):
            with self.lock:
                self.steps += 1
                self.step_ns = time.time_ns()
                self.publish()

        def guard(self, f, *args):
            if self.off:
                return None
            try:
                return f(*args)
            except Exception as e:
                self.off = True
                print("gotrain: collective progress of this rank is off (%s: %s); hangs are judged by its process state only" % (type(e).__name__, e), file=sys.stderr)
                return None

    counter = Counter()
    state = {"pg": None, "gloo": False}

    import json

    MAX_LINES = 256  # of DIR/PID.phases: a program calling phase() in a loop stays bounded
    MAX_MODULES = 300

    class Facts:
        """What this process's recovery took, for the agent."""

        def __init__(self):
            self.lock = threading.Lock()
            self.pid = os.getpid()
            self.fd = None
            self.lines = 0
            self.armed = False  # the next completed collective is written
            self.listed = False  # the modules were written

        def write(self, rec):
            with self.lock:
                # A forked child (a DataLoader worker) is not the rank.
                if os.getpid() != self.pid or self.lines >= MAX_LINES:
                    return
                if self.fd is None:
                    path = os.path.join(out, "%d.phases" % self.pid)
                    self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
                self.lines += 1
                os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

        def phase(self, name, seconds, **facts):
            rec = {k: v for k, v in facts.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
            rec.update(phase=str(name)[:40], seconds=float(seconds), end=time.time_ns())
            self.write(rec)
            self.armed = True

        def init_done(self, start, end):
            self.write({"phase": "init_process_group", "start": start, "end": end})
            self.armed = True
            self.modules()

        def completed(self, end):
            if self.armed:
                self.armed = False
                self.write({"phase": "collective", "end": end})

        def modules(self):
            # Installed packages only: the program's own modules may act on
            # its environment as they are imported, which a standby has not.
            if self.listed:
                return
            self.listed = True
            names = []
            for name, mod in list(sys.modules.items()):
                if "." in name or name.startswith("_") or not name.isidentifier():
                    continue
                f = getattr(mod, "__file__", None) or ""
                if "/site-packages/" in f or "/dist-packages/" in f:
                    names.append(name)
                    if len(names) >= MAX_MODULES:
                        break
            self.write({"modules": names})

    facts = Facts()

    def quietly(f, *args, **kwargs):
        # The timings are the agent's business: a failure to record one
        # never reaches the program, nor turns the collective counts off.
        try:
            f(*args, **kwargs)
        except Exception:
            pass

    def phase(name, seconds, **kw):
        """Record that the program's phase name took seconds, ending now."""
        quietly(facts.phase, name, seconds, **kw)

    import types

    hook = types.ModuleType("_gotrain_hook", "gotrain's torch hook, for the program's phases (internal/torchhook)")
    hook.phase = phase
    sys.modules["_gotrain_hook"] = hook

    def counted(dist, group):
        """Whether a collective on group is the gloo default group's."""
        try:
            pg = dist.distributed_c10d.GroupMember.WORLD  # None before init_process_group
            if pg is None or (group is not None and group is not pg):
                return False
            # By id: a reference held here would keep the group alive into
            # the interpreter's teardown, where gloo's threads abort it.
            if state["pg"] != id(pg):
                state["pg"], state["gloo"] = id(pg), dist.get_backend() == "gloo"
            return state["gloo"]
        except Exception:
            return False

    def wrap(dist, name, f, op):
        import functools
        import inspect

        try:
            params = list(inspect.signature(f).parameters)
        except (TypeError, ValueError):
            return f
        # Where group and async_op are when passed by position (binding
        # the signature on every call would cost more than the count).
        at_group = params.index("group") if "group" in params else None
        at_async = params.index("async_op") if "async_op" in params else None

        def arg(args, kwargs, name, at, default):
            if name in kwargs:
                return kwargs[name]
            if at is not None and at < len(args):
                return args[at]
            return default

        @functools.wraps(f)
        def collective(*args, **kwargs):
            depth = getattr(counter.tls, "depth", 0)
            seq = None
            if depth == 0 and not counter.off and counted(dist, arg(args, kwargs, "group", at_group, None)):
                seq = counter.guard(counter.enter, op)
            if seq is None:
                counter.tls.depth = depth + 1
                try:
                    return f(*args, **kwargs)
                finally:
                    counter.tls.depth = depth
            counter.tls.depth = depth + 1
            try:
                result = f(*args, **kwargs)
            except BaseException:
                counter.guard(counter.complete, seq)
                raise
            finally:
                counter.tls.depth = depth
            if arg(args, kwargs, "async_op", at_async, False) and hasattr(result, "get_future"):
                try:
                    result.get_future().then(lambda fut: counter.guard(counter.complete, seq))
                except Exception:
                    counter.guard(counter.complete, seq)
            else:
                counter.guard(counter.complete, seq)
            return result

        collective.__gotrain_counted__ = True
        collective.__gotrain_inner__ = f
        return collective

    def old_error_handling_name():
        # The agent sets only TORCH_NCCL_ASYNC_ERROR_HANDLING (the older
        # name warns on every rank from PyTorch 2.2 on); PyTorch before 2.2
        # reads only NCCL_ASYNC_ERROR_HANDLING, when its NCCL group is made.
        # Set as init_process_group is called, not at import: a Python
        # standby imports torch before it has the rank's environment.
        import torch

        v = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        if v is None or "NCCL_ASYNC_ERROR_HANDLING" in os.environ:
            return
        major, minor = (int("".join(c for c in x if c.isdigit()) or 0) for x in torch.__version__.split(".")[:2])
        if (major, minor) < (2, 2):
            os.environ["NCCL_ASYNC_ERROR_HANDLING"] = v

    def patch_dist(dist):
        for name, op in CALLS.items():
            f = getattr(dist, name, None)
            if f is not None and not getattr(f, "__gotrain_counted__", False):
                setattr(dist, name, wrap(dist, name, f, op))
        f = getattr(dist, "init_process_group", None)
        if f is not None and not getattr(f, "__gotrain_timed__", False):
            dist.init_process_group = timed_init(f)
        # The modules, should init_process_group never come.
        t = threading.Timer(30.0, quietly, (facts.modules,))
        t.daemon = True
        t.start()

    def timed_init(f):
        import functools

        @functools.wraps(f)
        def init_process_group(*args, **kwargs):
            quietly(old_error_handling_name)
            start = time.time_ns()
            result = f(*args, **kwargs)
            quietly(facts.init_done, start, time.time_ns())
            return result

        init_process_group.__gotrain_timed__ = True
        return init_process_group

    def patch_ddp(mod):
        ddp = getattr(mod, "DistributedDataParallel", None)
        if ddp is None:
            return
        forward = ddp.forward

        def counted_forward(self, *args, **kwargs):
            out = forward(self, *args, **kwargs)
            counter.guard(watch_backward, self, out)
            return out

        ddp.forward = counted_forward

    def tensors_of(out, depth=0):
        import torch

        if isinstance(out, torch.Tensor):
            return [out] if out.requires_grad else []
        if depth > 3:
            return []
        if isinstance(out, dict):
            out = list(out.values())
        if isinstance(out, (list, tuple)):
            return [t for o in out for t in tensors_of(o, depth + 1)]
        return []

    def watch_backward(module, out):
        # DDP reduces gradients inside the backward pass of its output: it
        # launches each bucket's all-reduce as gradients become ready and
        # waits for them in a callback the autograd engine runs at the end
        # of that backward. So the backward of a DDP output that syncs
        # gradients counts as one all-reduce: entered when the backward
        # reaches the output (before any bucket is launched), completed in
        # a final callback queued from a final callback, which the engine
        # runs after DDP's (queued when the first gradient is ready). DDP
        # itself is not changed: its reducer, buckets and numerics are its
        # own.
        import torch
        import torch.distributed as dist

        if not torch.is_grad_enabled() or not getattr(module, "require_backward_grad_sync", True):
            return  # no backward, or no_sync(): no gradient all-reduce
        if not counted(dist, getattr(module, "process_group", None)):
            return
        ts = tensors_of(out)
        if not ts:
            return
        engine = torch.autograd.Variable._execution_engine
        fired = []

        def reached(grad):
            if fired:
                return None
            fired.append(True)
            seq = counter.guard(counter.enter, "allreduce")
            if seq is not None:
                done = lambda: counter.guard(counter.complete, seq)
                engine.queue_callback(lambda: engine.queue_callback(done))
            return None

        for t in ts:
            t.register_hook(reached)

    def patch_optim(mod):
        # Each optimizer step is the rank's step, for the agent's step rate.
        # torch 2 calls global post-step hooks; older torch gets each
        # optimizer class's step wrapped as its first instance is made. A
        # step inside a counted one (a subclass calling its base's) is not
        # counted again.
        register = getattr(mod, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(lambda opt, args, kwargs: counter.guard(counter.stepped))
            return
        opt = getattr(mod, "Optimizer", None)
        if opt is None:
            return
        init = opt.__init__

        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            counter.guard(wrap_step, type(self))

        opt.__init__ = __init__

    def wrap_step(cls):
        import functools

        f = cls.step
        if getattr(f, "__gotrain_step__", False):
            return

        @functools.wraps(f)
        def step(*args, **kwargs):
            if getattr(counter.tls, "stepping", False):
                return f(*args, **kwargs)
            counter.tls.stepping = True
            try:
                result = f(*args, **kwargs)
            finally:
                counter.tls.stepping = False
            counter.guard(counter.stepped)
            return result

        step.__gotrain_step__ = True
        cls.step = step

    patches = {"torch.distributed": patch_dist, "torch.nn.parallel.distributed": patch_ddp, "torch.optim.optimizer": patch_optim}

    class Loader:
        def __init__(self, inner, fix):
            self.inner, self.fix = inner, fix

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            self.inner.exec_module(module)
            counter.guard(self.fix, module)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class Finder:
        def find_spec(self, name, path=None, target=None):
            fix = patches.get(name)
            if fix is None:
                return None
            for f in sys.meta_path:
                if f is self or not hasattr(f, "find_spec"):
                    continue
                spec = f.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = Loader(spec.loader, fix)
                    return spec
            return None

    sys.meta_path.insert(0, Finder())


_gotrain_sitecustomize()
del _gotrain_sitecustomize
