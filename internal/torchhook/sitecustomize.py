# gotrain's sitecustomize (internal/torchhook). The agent puts it on its
# workers' PYTHONPATH; the interpreter imports it at start-up, before the
# program. It does two things:
#
# 1. It runs the sitecustomize it shadows (the next one on sys.path, such as
#    Debian's), so the machine's own start-up hook still runs.
# 2. When GOTRAIN_TORCH_PROGRESS_DIR is set and the program uses
#    torch.distributed on a gloo default process group, it counts the
#    collectives of that group: each torch.distributed collective call, and
#    each gradient bucket DistributedDataParallel all-reduces (through a
#    comm hook that does what DDP's built-in reduction does: divide by the
#    world size, all-reduce, in the same order). The counts go to
#    DIR/PID.progress, a small memory-mapped record the agent reads each
#    second (layout in torchhook.go), so a rank that stops calling
#    collectives is named like a Go worker that does.
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

    # The record: little-endian, 256 bytes (torchhook.go's layout).
    MAGIC = b"GTHOOK1\n"
    HEAD = struct.Struct("<8sQqqqqqII")  # magic version entered completed completed_ns wait_ns pending_ns pending_op last_op
    RING = 16
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
            # A seqlock: odd while writing, so the agent never reads half.
            m = self.record()
            completed = min(self.open) - 1 if self.open else self.entered
            pending_ns, pending_op = 0, 0
            if self.open:
                pending_op, pending_ns = self.open[completed + 1]
            self.version += 1
            struct.pack_into("<Q", m, 8, self.version)
            HEAD.pack_into(m, 0, MAGIC, self.version, self.entered, completed, self.completed_ns, self.wait_ns, pending_ns, pending_op, self.last_op)
            struct.pack_into("<%dq" % RING, m, HEAD.size, *self.ring)
            self.version += 1
            struct.pack_into("<Q", m, 8, self.version)

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
                self.done += 1
                self.completed_ns = now
                self.wait_ns += now - item[1]
                self.ring[seq % RING] = now - item[1]
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

    def counted(dist, group):
        """Whether a collective on group is the gloo default group's."""
        try:
            if not dist.is_initialized():
                return False
            pg = dist.distributed_c10d._get_default_group()
            if group is not None and group is not pg and group is not getattr(dist.group, "WORLD", None):
                return False
            if state["pg"] is not pg:
                state["pg"], state["gloo"] = pg, dist.get_backend() == "gloo"
            return state["gloo"]
        except Exception:
            return False

    def wrap(dist, name, f, op):
        import functools
        import inspect

        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError):
            return f

        @functools.wraps(f)
        def collective(*args, **kwargs):
            depth = getattr(counter.tls, "depth", 0)
            seq = None
            if depth == 0 and not counter.off:
                try:
                    bound = sig.bind_partial(*args, **kwargs).arguments
                except TypeError:
                    bound = {}
                if counted(dist, bound.get("group")):
                    seq = counter.guard(counter.enter, op)
                    is_async = bool(bound.get("async_op", False))
            counter.tls.depth = depth + 1
            try:
                result = f(*args, **kwargs)
            except BaseException:
                if seq is not None:
                    counter.guard(counter.complete, seq)
                raise
            finally:
                counter.tls.depth = depth
            if seq is not None:
                if is_async and result is not None and hasattr(result, "get_future"):
                    def then(fut, seq=seq):
                        counter.guard(counter.complete, seq)
                        return None
                    try:
                        result.get_future().then(then)
                    except Exception:
                        counter.guard(counter.complete, seq)
                else:
                    counter.guard(counter.complete, seq)
            return result

        collective.__gotrain_counted__ = True
        return collective

    def patch_dist(dist):
        for name, op in CALLS.items():
            f = getattr(dist, name, None)
            if f is not None and not getattr(f, "__gotrain_counted__", False):
                setattr(dist, name, wrap(dist, name, f, op))

    def patch_ddp(mod):
        ddp = getattr(mod, "DistributedDataParallel", None)
        if ddp is None:
            return
        register, builtin, forward = ddp.register_comm_hook, ddp._register_builtin_comm_hook, ddp.forward

        def user_hook(self, *args, **kwargs):
            self._gotrain_hooked = True  # the program's hook: its collectives count where they call torch.distributed
            return register(self, *args, **kwargs)

        def user_builtin(self, *args, **kwargs):
            self._gotrain_hooked = True
            return builtin(self, *args, **kwargs)

        def hooked_forward(self, *args, **kwargs):
            if not getattr(self, "_gotrain_hooked", False):
                self._gotrain_hooked = True
                import torch.distributed as dist

                if not counter.off and counted(dist, getattr(self, "process_group", None)):
                    register(self, None, allreduce_bucket)
            return forward(self, *args, **kwargs)

        ddp.register_comm_hook, ddp._register_builtin_comm_hook, ddp.forward = user_hook, user_builtin, hooked_forward

    def allreduce_bucket(state, bucket):
        # What DDP's reducer does without a hook: the gradients divided by
        # the world size, summed over the ranks (dist.all_reduce is counted).
        import torch.distributed as dist

        t = bucket.buffer()
        t.div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    allreduce_bucket.__qualname__ = "gotrain_counted_allreduce_hook"

    patches = {"torch.distributed": patch_dist, "torch.nn.parallel.distributed": patch_ddp}

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
