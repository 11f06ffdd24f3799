"""In-memory snapshots for PyTorch programs under gotrain.

Two lines make a restarted rank resume from its last step instead of its
last disk checkpoint:

    state, step = gotrain.restore_into({"model": model, "opt": opt}) or (None, 0)
    gotrain.snapshot({"model": model, "opt": opt}, step)   # after a step

snapshot() copies every tensor (GPU or CPU) straight into shared memory as
raw bytes: GPU tensors with an asynchronous device-to-host copy into memory
registered with CUDA (pinned), queued on the current stream, so that
whatever the program does next on the GPU runs after the copy and cannot
change what the snapshot holds. It returns once the copy is queued; a
background thread hands the snapshot to this rank's gotrain agent when the
copy is complete. The agent checksums it (in Go, on all cores), keeps the
newest complete one in memory that outlives this process, and sends it to
a peer node.

restore_into() copies the newest snapshot into the existing tensors of the
model, the optimizer (its state is created on its parameters' devices) or
any dict of tensors, straight from the agent's memory; restore() returns
new tensors instead. Plain values (numbers, strings, lists, dicts) come
back as they were. The snapshot's header is data, never code: nothing is
unpickled, and every offset is checked against the file.

Outside gotrain (plain python, torchrun) snapshot() returns False and the
restores return None, with one note on stderr.
"""

import mmap
import os
import socket
import sys
import threading
import time
import warnings

from . import _format
from ._format import FormatError

__all__ = ["snapshot", "restore", "restore_into", "available", "source", "wait", "Pending", "FormatError"]

_SOURCE_NAMES = {"agent": "this node's agent's memory", "peer": "a peer node's replica"}

_lock = threading.RLock()  # the socket: one request at a time
_conn = None
_source = None
_noted = False
_pending = None  # the snapshot being handed over
_buffers = []  # this process's reusable shared-memory buffers (two, in turn)
_next_buffer = 0


_TRACE = os.environ.get("GOTRAIN_SNAPSHOT_TRACE") == "1"


def _trace(what, t0):
    """With GOTRAIN_SNAPSHOT_TRACE=1, one stderr line per phase: where a
    snapshot's or restore's time goes."""
    if _TRACE:
        sys.stderr.write("gotrain.snapshot: trace rank %d %s %.4f s\n" % (_rank(), what, time.perf_counter() - t0))
    return time.perf_counter()


def _rank():
    return int(os.environ.get("GOTRAIN_RANK", os.environ.get("RANK", "0")))


def _host():
    return socket.gethostname()


def _socket_path():
    agent = os.environ.get("GOTRAIN_AGENT", "")
    return os.path.join(os.path.dirname(agent), "snapshot.sock") if agent else ""


def _note_outside():
    global _noted
    if not _noted:
        _noted = True
        sys.stderr.write("gotrain.snapshot: not running under gotrain (no GOTRAIN_AGENT): snapshots are not kept and "
                         "restores find nothing; run the program with `gotrain torchrun` or `gotrain launch`\n")
        sys.stderr.flush()


def _call(req, fd=-1):
    import json

    with _lock:
        socket.send_fds(_conn, [json.dumps(req).encode()], [fd] if fd >= 0 else [])
        msg, got, _flags, _addr = socket.recv_fds(_conn, 4097, 1)
    rep = json.loads(msg) if msg else {"err": "the agent closed the snapshot socket"}
    return rep, (got[0] if got else -1)


def _connect():
    global _conn
    with _lock:
        if _conn is not None:
            return True
        path = _socket_path()
        if not path:
            _note_outside()
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            raise RuntimeError("rank %d on %s: cannot reach this node's gotrain agent at %s (%s); is the agent still running?"
                               % (_rank(), _host(), path, e)) from None
        _conn = s
        rep, fd = _call({"op": "hello", "token": os.environ.get("GOTRAIN_JOB_TOKEN", ""), "rank": _rank(), "pid": os.getpid()})
        if fd >= 0:
            os.close(fd)
        if rep.get("err"):
            _conn = None
            s.close()
            raise RuntimeError("rank %d on %s: the agent refused the snapshot connection: %s" % (_rank(), _host(), rep["err"]))
        return True


def available():
    """Whether this process runs under a gotrain agent that keeps snapshots."""
    try:
        return _connect()
    except RuntimeError:
        return False


def source():
    """Where the last restore found its state: "agent", "peer", or None."""
    return _source


# ---- state trees ---------------------------------------------------------


def _torch():
    import torch

    return torch


def _is_module(v):
    torch = _torch()
    return isinstance(v, torch.nn.Module)


def _is_optimizer(v):
    torch = _torch()
    return isinstance(v, torch.optim.Optimizer)


def _plain(state):
    """state with modules and optimizers replaced by their state_dicts."""
    if _is_module(state) or _is_optimizer(state):
        return state.state_dict()
    if isinstance(state, dict):
        return {k: _plain(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_plain(v) for v in state]
    if isinstance(state, tuple):
        return tuple(_plain(v) for v in state)
    return state


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _describe(t):
    return _dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size()


def _check_tensor(t):
    torch = _torch()
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError("gotrain snapshot: a %s tensor; snapshots keep dense tensors only" % (t.layout,))
    return True


# ---- shared memory -------------------------------------------------------


class _Buffer:
    """A memfd this process writes snapshots into, mapped, its pages
    registered with CUDA once when the snapshot holds GPU tensors."""

    def __init__(self, size):
        self.fd = os.memfd_create("gotrain-snapshot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED) if size else None
            if size:
                # Fault every page in writable now, in one call, rather
                # than one fault per page during the copy.
                try:
                    self.map.madvise(_MADV_POPULATE_WRITE)
                except (OSError, AttributeError):
                    pass  # older kernels: the copy faults them in
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.registered = False
        self.tensor = None

    def bytes_tensor(self):
        if self.tensor is None:
            torch = _torch()
            self.tensor = torch.frombuffer(self.map, dtype=torch.uint8) if self.size else torch.empty(0, dtype=torch.uint8)
        return self.tensor

    def register(self):
        if self.registered or not self.size:
            return self.registered
        t = time.perf_counter()
        self.registered = _host_register(self.bytes_tensor().data_ptr(), self.size, readonly=False)
        _trace("register %d bytes for snapshots: %s" % (self.size, self.registered), t)
        return self.registered

    def close(self):
        if self.registered:
            _host_unregister(self.tensor.data_ptr())
        self.tensor = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass  # a view still exists; the mapping goes with the process
        os.close(self.fd)


def _cudart():
    torch = _torch()
    try:
        return torch.cuda.cudart()
    except Exception:
        return None


_REGISTER_READONLY = 8  # cudaHostRegisterReadOnly
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14


def _host_register(ptr, size, readonly):
    rt = _cudart()
    if rt is None:
        return False
    try:
        err = rt.cudaHostRegister(ptr, size, _REGISTER_READONLY if readonly else 0)
    except Exception:
        return False
    return int(err) == 0


def _host_unregister(ptr):
    rt = _cudart()
    if rt is not None:
        try:
            rt.cudaHostUnregister(ptr)
        except Exception:
            pass


def _buffer_for(size):
    """One of this process's two buffers, of exactly size bytes, that the
    agent does not serve now (the other one may be the rank's newest)."""
    global _next_buffer
    if len(_buffers) < 2:
        _buffers.append(None)
    i = _next_buffer % 2
    _next_buffer += 1
    b = _buffers[i]
    if b is None or b.size != size:
        if b is not None:
            b.close()
        b = _Buffer(size)
        _buffers[i] = b
    return b


# ---- snapshot ------------------------------------------------------------


class Pending:
    """A snapshot whose copy is queued: wait() returns once the agent holds
    it (raising what the agent said if it did not keep it)."""

    def __init__(self, step, nbytes):
        self.step, self.nbytes = step, nbytes
        self._done = threading.Event()
        self._err = None
        self.copy_seconds = None  # from the call to the copy's end
        self.seconds = None  # from the call to the agent's answer

    def __bool__(self):
        return True

    def done(self):
        return self._done.is_set()

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            return False
        if self._err is not None:
            raise self._err
        return True


def wait():
    """Wait until the last snapshot is held by the agent (or raise why not)."""
    p = _pending
    return True if p is None else p.wait()


def snapshot(state, step, blocking=False):
    """Hand state to this rank's agent as the state after step.

    state is a tensor, a state_dict, a module or optimizer, or a dict, list
    or tuple of these and plain values. GPU tensors are copied
    asynchronously (see the module's doc): the call returns a Pending once
    the copy is queued; with blocking=True it returns once the agent holds
    the snapshot. Returns False outside gotrain. The previous snapshot's
    hand-over is waited for first, so one is in flight at a time."""
    global _pending
    if not _connect():
        return False
    torch = _torch()
    prev, _pending = _pending, None
    if prev is not None:
        prev.wait()  # raises, once, why the agent did not keep it
    start = time.perf_counter()
    plain = _plain(state)
    facts = {"rank": _rank(), "step": int(step), "generation": int(os.environ.get("GOTRAIN_GENERATION", "0") or 0),
             "run_id": os.environ.get("GOTRAIN_RUN_ID", "")}
    layout, tensors = _format.encode(plain, lambda v: torch.is_tensor(v) and _check_tensor(v), _describe, facts)
    header = layout.header_bytes()
    room = layout.data_start - _format.PREFIX.size
    header = header + b" " * (room - len(header))
    t = _trace("encode", start)
    buf = _buffer_for(layout.size)
    whole = buf.bytes_tensor()
    t = _trace("buffer", t)
    whole[:layout.data_start].copy_(torch.frombuffer(bytearray(layout.prefix(header)), dtype=torch.uint8))
    on_gpu = any(t.is_cuda for t in tensors)
    if on_gpu:
        buf.register()
    event = None
    with torch.no_grad():
        for src, e in zip(tensors, layout.tensors):
            if not e.nbytes:
                continue
            dst = whole[e.offset:e.offset + e.nbytes].view(src.dtype).view(src.shape)
            if src.is_cuda:
                dst.copy_(src.detach(), non_blocking=buf.registered)
            else:
                dst.copy_(src.detach())
        if on_gpu:
            event = torch.cuda.Event()
            event.record()
    _trace("copies queued", t)
    p = Pending(int(step), layout.size)
    _pending = p

    def hand_over():
        try:
            if event is not None:
                event.synchronize()
            p.copy_seconds = time.perf_counter() - start
            t = _trace("copied", start)
            rep, out = _call({"op": "put", "rank": _rank(), "step": int(step), "size": layout.size,
                              "sum": "agent", "format": "gtsnap1", "reuse": True}, buf.fd)
            if out >= 0:
                os.close(out)
            _trace("handed over", t)
            if rep.get("err"):
                raise RuntimeError("rank %d on %s: the agent did not keep the snapshot of step %d: %s"
                                   % (_rank(), _host(), step, rep["err"]))
        except BaseException as e:
            p._err = e
        finally:
            p.seconds = time.perf_counter() - start
            p._done.set()

    if blocking or event is None:
        hand_over()
        _pending = None  # done: its error, if any, is raised here only
        p.wait()
    else:
        threading.Thread(target=hand_over, name="gotrain-snapshot", daemon=True).start()
    return p


def _wait_at_exit():
    p = _pending
    if p is not None:
        try:
            p.wait(10)  # bounded: an exit (Ctrl-C included) never waits long on the agent
        except BaseException as e:
            sys.stderr.write("gotrain.snapshot: %s\n" % e)


import atexit  # noqa: E402

atexit.register(_wait_at_exit)


# ---- restore -------------------------------------------------------------


class _Mapped:
    """The newest snapshot of this rank, mapped read-only, its header
    checked: views of its tensors are valid until close()."""

    def __init__(self, fd, size, rep):
        self.rep = rep
        self.registered = False
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self.map = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) if size else None
        self.layout = _format.decode(self.map if size else b"", want_rank=_rank())
        run = os.environ.get("GOTRAIN_RUN_ID", "")
        if run and self.layout.facts["run_id"] not in ("", run):
            raise FormatError("a snapshot of run %r, not of this run %r" % (self.layout.facts["run_id"], run))
        if self.layout.facts["step"] != int(rep.get("step", -1)):
            raise FormatError("the header says step %d, the agent says %s" % (self.layout.facts["step"], rep.get("step")))
        torch = _torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only mapping: the views are never written
            self.whole = torch.frombuffer(self.map, dtype=torch.uint8)
        self.step = self.layout.facts["step"]
        self.size = size

    def register(self):
        if not self.registered:
            t = time.perf_counter()
            self.registered = _host_register(self.whole.data_ptr(), self.size, readonly=True)
            _trace("register %d bytes to restore from: %s" % (self.size, self.registered), t)
        return self.registered

    def view(self, i):
        torch = _torch()
        e = self.layout.tensors[i]
        dtype = getattr(torch, e.dtype, None)
        if dtype is None:
            raise FormatError("dtype %s is not in this torch" % e.dtype)
        if not e.nbytes:
            return torch.empty(e.shape, dtype=dtype)
        return self.whole[e.offset:e.offset + e.nbytes].view(dtype).view(e.shape)

    def close(self):
        if self.registered:
            _host_unregister(self.whole.data_ptr())
            self.registered = False
        self.whole = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass


def _latest():
    """The agent's newest snapshot of this rank, mapped; None if none."""
    global _source
    _source = None
    if not _connect():
        return None
    rep, fd = _call({"op": "latest", "rank": _rank()})
    if rep.get("err"):
        if fd >= 0:
            os.close(fd)
        raise RuntimeError("rank %d on %s: the agent could not serve this rank's snapshot: %s" % (_rank(), _host(), rep["err"]))
    if not rep.get("found"):
        if fd >= 0:
            os.close(fd)
        return None
    try:
        size = int(rep.get("size", 0))
        if os.fstat(fd).st_size != size:
            raise RuntimeError("rank %d on %s: the snapshot of step %s holds %d bytes, the agent says %d"
                               % (_rank(), _host(), rep.get("step"), os.fstat(fd).st_size, size))
        try:
            return _Mapped(fd, size, rep)
        except FormatError as e:
            raise RuntimeError("rank %d on %s: the snapshot of step %s the agent served is not valid (%s); it is not used"
                               % (_rank(), _host(), rep.get("step"), e)) from None
    finally:
        os.close(fd)


def _build(tree, leaf):
    if isinstance(tree, _format.TensorRef):
        return leaf(tree.index)
    if isinstance(tree, dict):
        return {k: _build(v, leaf) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_build(v, leaf) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_build(v, leaf) for v in tree)
    return tree


def _said(m, t0, nbytes):
    global _source
    _source = m.rep.get("source") or "agent"
    secs = time.perf_counter() - t0
    sys.stderr.write("gotrain.snapshot: rank %d restored the state of step %d from %s (%d bytes, %.3f s)\n"
                     % (_rank(), m.step, _SOURCE_NAMES.get(_source, _source), nbytes, secs))
    sys.stderr.flush()
    hook = sys.modules.get("_gotrain_hook")
    report = getattr(hook, "phase", None)
    if report is not None:
        try:
            report("restore", secs, bytes=nbytes, source=_source, step=m.step)
        except Exception:
            pass


def restore(map_location="cpu", with_source=False):
    """Return (state, step) of this rank's newest snapshot, the tensors new
    ones on map_location, or None when there is none or outside gotrain.
    With with_source, (state, step, source)."""
    device = _torch().device(map_location)
    return _restoring(device.type == "cuda", lambda m: _build(m.layout.tree, lambda i: _new_tensor(m, i, device)), with_source)


def restore_into(target, with_source=False):
    """Copy this rank's newest snapshot into target's existing tensors and
    return (state, step) — state: the snapshot's tree, with target's own
    tensors where target has them — or None when there is none (target is
    then untouched) or outside gotrain.

    target has the shape of what was passed to snapshot(): a module, an
    optimizer, a state_dict of tensors, or a dict/list/tuple of these.
    Tensors are copied onto their devices straight from the agent's memory;
    a module's parameters and buffers keep their identity. An optimizer's
    state is built on its parameters' devices and loaded with
    load_state_dict (a fresh optimizer has no state tensors to fill). A
    tensor whose shape or dtype differs from the snapshot's is an error that
    names it, raised before anything is copied."""
    torch = _torch()

    def fill(m):
        plan = []  # (destination tensor, index), every pair checked before any copy
        _match(target, m.layout.tree, "", plan, m)
        with torch.no_grad():
            for dst, i in plan:
                dst.copy_(m.view(i), non_blocking=m.registered and dst.is_cuda)
        return _fill(target, m.layout.tree, m)

    return _restoring(_cuda_in(target), fill, with_source)


def _restoring(cuda, fill, with_source):
    """The newest snapshot, mapped (and registered with CUDA when cuda),
    made into a state by fill(mapped); None when there is none."""
    torch = _torch()
    t0 = time.perf_counter()
    m = _latest()
    if m is None:
        return None
    try:
        if cuda:
            m.register()
        state = fill(m)
        if m.registered:
            torch.cuda.synchronize()
        _said(m, t0, m.size)
        step = m.step
    finally:
        m.close()
    if with_source:
        return state, step, _source
    return state, step


def _cuda_in(target):
    torch = _torch()
    if _is_module(target):
        return any(t.is_cuda for t in target.state_dict().values() if torch.is_tensor(t))
    if _is_optimizer(target):
        return any(p.is_cuda for g in target.param_groups for p in g["params"])
    if torch.is_tensor(target):
        return target.is_cuda
    if isinstance(target, dict):
        return any(_cuda_in(v) for v in target.values())
    if isinstance(target, (list, tuple)):
        return any(_cuda_in(v) for v in target)
    return False


def _where(path):
    return path or "the top"


def _match(target, tree, path, plan, m):
    """Pair target's tensors with the snapshot's, checking every pair."""
    torch = _torch()
    if _is_optimizer(target):
        return  # filled by load_state_dict (_fill)
    if _is_module(target):
        target = target.state_dict(keep_vars=True)
    if isinstance(tree, _format.TensorRef):
        if not torch.is_tensor(target):
            return  # nothing to fill: a new tensor is made
        e = m.layout.tensors[tree.index]
        if tuple(target.shape) != e.shape or _dtype_name(target.dtype) != e.dtype:
            raise RuntimeError("rank %d on %s: the snapshot of step %d has %s of shape %s and %s, the program's is %s and %s; "
                               "was the model changed since the snapshot?"
                               % (_rank(), _host(), m.step, _where(path), list(e.shape), e.dtype, list(target.shape), _dtype_name(target.dtype)))
        plan.append((target.data if isinstance(target, torch.nn.Parameter) else target, tree.index))
        return
    if isinstance(tree, dict) and isinstance(target, dict):
        for k, v in tree.items():
            if k in target:
                _match(target[k], v, "%s.%s" % (path, k) if path else str(k), plan, m)
    elif isinstance(tree, (list, tuple)) and isinstance(target, (list, tuple)):
        for i, (t, v) in enumerate(zip(target, tree)):
            _match(t, v, "%s[%d]" % (path, i), plan, m)


def _fill(target, tree, m, device=None):
    """The snapshot's tree, with target's tensors where _match paired them
    and new tensors elsewhere: on the optimizer's parameters' devices
    inside an optimizer, on the CPU otherwise."""
    torch = _torch()
    if _is_optimizer(target):
        sd = _optimizer_state(target, tree, m)
        target.load_state_dict(sd)
        return sd
    if _is_module(target):
        target = target.state_dict()
    if isinstance(tree, _format.TensorRef):
        if torch.is_tensor(target):
            return target
        return _new_tensor(m, tree.index, device)
    if isinstance(tree, dict):
        t = target if isinstance(target, dict) else {}
        return {k: _fill(t.get(k), v, m, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        t = target if isinstance(target, (list, tuple)) else []
        out = [_fill(t[i] if i < len(t) else None, v, m, device) for i, v in enumerate(tree)]
        return tuple(out) if isinstance(tree, tuple) else out
    return tree


def _new_tensor(m, i, device):
    torch = _torch()
    src = m.view(i)
    if device is None or torch.device(device).type == "cpu":
        return src.clone()
    out = torch.empty(src.shape, dtype=src.dtype, device=device)
    out.copy_(src, non_blocking=m.registered)
    return out


def _optimizer_state(opt, tree, m):
    """An optimizer's state_dict from the snapshot, its state tensors made
    on the devices of the parameters they belong to."""
    if not (isinstance(tree, dict) and isinstance(tree.get("state"), dict)):
        return _fill(None, tree, m)
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for k, v in tree.items():
        if k != "state":
            out[k] = _fill(None, v, m)
    state = {}
    for pid, per in tree["state"].items():
        dev = params[pid].device if isinstance(pid, int) and 0 <= pid < len(params) else None
        if isinstance(per, dict):
            # A scalar "step" stays on the CPU, as the optimizers keep it.
            state[pid] = {name: _fill(None, x, m, dev if not (isinstance(x, _format.TensorRef) and not m.layout.tensors[x.index].shape) else None)
                          for name, x in per.items()}
        else:
            state[pid] = _fill(None, per, m, dev)
    out["state"] = state
    return out
