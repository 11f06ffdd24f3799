"""In-memory snapshots for PyTorch programs under gotrain (issue 29).

Two lines make a restarted rank resume from its last step instead of its
last disk checkpoint:

    state, step = gotrain_snapshot.restore() or (None, 0)   # at start
    gotrain_snapshot.snapshot(model_and_optimizer_state, step)  # after a step

restore(with_source=True) also says where the state came from: "agent"
(this node's agent kept it), "peer" (a peer node's agent held a replica),
and source() says it of the last restore; each restore prints one line to
stderr naming the step and the source.

The state goes into a memfd that is handed to this rank's gotrain agent over
its snapshot socket (SCM_RIGHTS); the agent keeps the newest complete one in
memory that outlives this process, checked by length and CRC-32. Standard
library and torch only. Outside gotrain both calls do nothing (restore
returns None).
"""

import io
import json
import mmap
import os
import socket
import zlib

__all__ = ["snapshot", "restore", "available", "source", "dcp_writer", "dcp_reader"]

_conn = None
_source = None

# How restore's line names a source.
_SOURCE_NAMES = {"agent": "this node's agent's memory", "peer": "a peer node's replica"}


def _socket_path():
    agent = os.environ.get("GOTRAIN_AGENT", "")
    return os.path.join(os.path.dirname(agent), "snapshot.sock") if agent else ""


def _call(req, fd=-1):
    fds = [fd] if fd >= 0 else []
    socket.send_fds(_conn, [json.dumps(req).encode()], fds)
    msg, got, _flags, _addr = socket.recv_fds(_conn, 4097, 1)
    rep = json.loads(msg) if msg else {"err": "the agent closed the snapshot socket"}
    return rep, (got[0] if got else -1)


def _connect():
    global _conn
    if _conn is not None:
        return True
    path = _socket_path()
    if not path:
        return False
    rank = int(os.environ.get("GOTRAIN_RANK", "0"))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    _conn = s
    rep, fd = _call({"op": "hello", "token": os.environ.get("GOTRAIN_JOB_TOKEN", ""), "rank": rank, "pid": os.getpid()})
    if fd >= 0:
        os.close(fd)
    if rep.get("err"):
        _conn = None
        s.close()
        raise RuntimeError("rank %d: the agent refused the snapshot connection: %s" % (rank, rep["err"]))
    return True


def available():
    """Whether this process runs under a gotrain agent that keeps snapshots."""
    try:
        return _connect()
    except OSError:
        return False


def snapshot(state, step):
    """Hand state (anything torch.save takes: a state_dict, tensors) to the
    agent as the state after step. Returns False outside gotrain."""
    import torch

    if not _connect():
        return False
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getbuffer()
    fd = os.memfd_create("gotrain-snapshot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, len(data))
        if len(data):
            with mmap.mmap(fd, len(data)) as m:
                m[:] = data
        rep, out = _call({"op": "put", "rank": int(os.environ.get("GOTRAIN_RANK", "0")), "step": int(step),
                          "size": len(data), "crc": zlib.crc32(data), "sum": "crc32"}, fd)
        if out >= 0:
            os.close(out)
    finally:
        os.close(fd)
    if rep.get("err"):
        raise RuntimeError("the agent did not keep the snapshot of step %d: %s" % (step, rep["err"]))
    return True


def source():
    """Where the last restore found its state: "agent", "peer", or None
    (no restore yet, nothing found, or outside gotrain)."""
    return _source


def restore(map_location="cpu", with_source=False):
    """Return (state, step) of this rank's newest snapshot in its agent's
    memory (or a peer's), or None when there is none or outside gotrain.
    With with_source, (state, step, source), source "agent" or "peer"."""
    global _source
    import time
    import sys
    import torch

    _source = None
    start = time.monotonic()

    if not _connect():
        return None
    rep, fd = _call({"op": "latest", "rank": int(os.environ.get("GOTRAIN_RANK", "0"))})
    if rep.get("err"):
        if fd >= 0:
            os.close(fd)
        raise RuntimeError("the agent could not serve this rank's snapshot: %s" % rep["err"])
    if not rep.get("found"):
        return None
    try:
        size = rep.get("size", 0)
        if os.fstat(fd).st_size != size:
            raise RuntimeError("the snapshot of step %d holds %d bytes, the agent says %d" % (rep.get("step", 0), os.fstat(fd).st_size, size))
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            data = bytes(m)
    finally:
        os.close(fd)
    want, sumname = rep.get("crc", 0), rep.get("sum", "")
    if sumname == "crc32" and zlib.crc32(data) != want:
        raise RuntimeError("the snapshot of step %d fails its CRC-32 check: torn, not used" % rep.get("step", 0))
    if sumname not in ("", "crc32"):
        raise RuntimeError("unknown checksum %r" % sumname)
    # A CRC-32C (a Go worker's) was checked by the agent; Python's standard
    # library has no CRC-32C.
    state, step = torch.load(io.BytesIO(data), map_location=map_location), int(rep.get("step", 0))
    _source = rep.get("source") or "agent"
    sys.stderr.write("gotrain_snapshot: rank %s restored the state of step %d from %s (%d bytes, %.3f s)\n" % (
        os.environ.get("GOTRAIN_RANK", "0"), step, _SOURCE_NAMES.get(_source, _source), size, time.monotonic() - start))
    sys.stderr.flush()
    if with_source:
        return state, step, _source
    return state, step


def dcp_writer(step):
    """A torch.distributed.checkpoint storage writer over this tier:

        dcp.save(state_dict, storage_writer=gotrain_snapshot.dcp_writer(step))

    Each rank hands its whole local (flattened) state to its agent as the
    state after step, whichever items DCP's planner gave it to write (data
    parallel ranks hold the same tensors, and a restarted rank can read only
    its own snapshot). Plain and replicated tensors only: no DTensor or
    ShardedTensor. Needs a torch with torch.distributed.checkpoint (2.x)."""
    return _dcp_classes()[0](step)


def dcp_reader():
    """The storage reader of dcp_writer's snapshots:

        r = gotrain_snapshot.dcp_reader()
        if r.found:
            dcp.load(state_dict, storage_reader=r)   # then r.step, r.source

    found is False (and load would fail) when the agent holds no snapshot
    of this rank or outside gotrain."""
    return _dcp_classes()[1]()


_dcp = None


def _dcp_classes():
    global _dcp
    if _dcp is not None:
        return _dcp
    import torch
    from torch.distributed.checkpoint import StorageReader, StorageWriter
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.distributed.checkpoint.storage import WriteResult

    def done(value):
        fut = torch.futures.Future()
        fut.set_result(value)
        return fut

    class Writer(StorageWriter):
        def __init__(self, step):
            super().__init__()
            self.step = int(step)

        def reset(self, checkpoint_id=None):
            pass

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id):
            return False  # never picked by path: pass it as storage_writer

        def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
            pass

        def prepare_local_plan(self, plan):
            return plan

        def prepare_global_plan(self, plans):
            return plans

        def write_data(self, plan, planner):
            # The planner's whole flattened state, not only the items it
            # gave this rank: a restarted rank reads only its own snapshot.
            flat = getattr(planner, "state_dict", None)
            if flat is None:
                flat = {item.index.fqn: planner.resolve_data(item) for item in plan.items}
            local = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in flat.items()}
            if not snapshot(local, self.step):
                raise RuntimeError("gotrain_snapshot.dcp_writer: not running under a gotrain agent")
            return done([WriteResult(index=item.index, size_in_bytes=0, storage_data=None) for item in plan.items])

        def finish(self, metadata, results):
            pass

    class Reader(StorageReader):
        def __init__(self):
            super().__init__()
            got = restore(with_source=True)
            self.found = got is not None
            self.flat, self.step, self.source = got if got else ({}, 0, None)

        def reset(self, checkpoint_id=None):
            pass

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id):
            return False

        def read_metadata(self, *args, **kwargs):
            if not self.found:
                raise RuntimeError("gotrain_snapshot.dcp_reader: the agent holds no snapshot of this rank")
            md = {}
            for k, v in self.flat.items():
                if torch.is_tensor(v):
                    md[k] = TensorStorageMetadata(properties=TensorProperties.create_from_tensor(v), size=v.size(),
                                                  chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * v.dim()), sizes=v.size())])
                else:
                    md[k] = BytesStorageMetadata()
            return Metadata(state_dict_metadata=md)

        def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
            pass

        def prepare_local_plan(self, plan):
            return plan

        def prepare_global_plan(self, plans):
            return plans

        def read_data(self, plan, planner):
            for item in plan.items:
                value = self.flat[item.storage_index.fqn]
                if item.type == LoadItemType.BYTE_IO:
                    buf = io.BytesIO()
                    torch.save(value, buf)
                    buf.seek(0)
                    planner.load_bytes(item, buf)
                    continue
                src = value
                for dim, (off, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                    src = src.narrow(dim, off, n)
                dst = planner.resolve_tensor(item).detach()
                dst.copy_(src)
                planner.commit_tensor(item, dst)
            return done(None)

    _dcp = (Writer, Reader)
    return _dcp
