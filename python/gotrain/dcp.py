"""torch.distributed.checkpoint storage over gotrain's in-memory tier.

    dcp.save(state_dict, storage_writer=gotrain.dcp.writer(step))

    r = gotrain.dcp.reader()
    if r.found:
        dcp.load(state_dict, storage_reader=r)   # then r.step, r.source

Each rank hands its whole local (flattened) state to its agent as the state
after step, whichever items DCP's planner gave it to write (data-parallel
ranks hold the same tensors, and a restarted rank can read only its own
snapshot). The reader copies straight from the agent's memory into the
tensors dcp.load gives it. Plain and replicated tensors only: no DTensor or
ShardedTensor. Needs torch.distributed.checkpoint (torch 2.x).
"""

import io

from . import memsnap as _snap

__all__ = ["writer", "reader"]


def writer(step):
    """A StorageWriter that keeps this rank's state as the state after step."""
    return _classes()[0](step)


def reader():
    """A StorageReader of this rank's newest snapshot; .found is False (and
    load would fail) when the agent holds none or outside gotrain."""
    return _classes()[1]()


_cached = None


def _classes():
    global _cached
    if _cached is not None:
        return _cached
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
            local = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in flat.items()}
            if not _snap.snapshot(local, self.step, blocking=True):
                raise RuntimeError("gotrain.dcp.writer: not running under a gotrain agent")
            return done([WriteResult(index=item.index, size_in_bytes=0, storage_data=None) for item in plan.items])

        def finish(self, metadata, results):
            pass

    class Reader(StorageReader):
        def __init__(self):
            super().__init__()
            import time

            self._t0 = time.perf_counter()
            self._m = _snap._latest()
            self.found = self._m is not None
            self.step, self.source, self.flat = 0, None, {}
            if self.found:
                self.step = self._m.step
                tree = self._m.layout.tree
                self.flat = tree if isinstance(tree, dict) else {}

        def reset(self, checkpoint_id=None):
            pass

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id):
            return False

        def read_metadata(self, *args, **kwargs):
            if not self.found:
                raise RuntimeError("gotrain.dcp.reader: the agent holds no snapshot of this rank")
            md = {}
            for k, v in self.flat.items():
                if isinstance(v, _snap._format.TensorRef):
                    e = self._m.layout.tensors[v.index]
                    t = self._m.view(v.index)
                    md[k] = TensorStorageMetadata(properties=TensorProperties.create_from_tensor(t), size=torch.Size(e.shape),
                                                  chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(e.shape)), sizes=torch.Size(e.shape))])
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
            m = self._m
            if any(planner.resolve_tensor(item).is_cuda for item in plan.items if item.type != LoadItemType.BYTE_IO):
                m.register()
            for item in plan.items:
                value = self.flat[item.storage_index.fqn]
                if item.type == LoadItemType.BYTE_IO:
                    # DCP loads a non-tensor value with torch.load from the
                    # stream it is given: the value was decoded from the
                    # data-only header here, and this process writes the
                    # bytes DCP reads back, so nothing served is unpickled.
                    buf = io.BytesIO()
                    torch.save(_snap._build(value, lambda i: m.view(i).clone()), buf)
                    buf.seek(0)
                    planner.load_bytes(item, buf)
                    continue
                src = m.view(value.index)
                for dim, (off, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                    src = src.narrow(dim, off, n)
                dst = planner.resolve_tensor(item).detach()
                dst.copy_(src, non_blocking=m.registered and dst.is_cuda)
                planner.commit_tensor(item, dst)
            if m.registered:
                torch.cuda.synchronize()
            _snap._said(m, self._t0, m.size)
            self.source = _snap.source()
            m.close()
            return done(None)

    _cached = (Writer, Reader)
    return _cached
