"""gotrain_snapshot: the name earlier gotrain versions gave the snapshot
module; the same API as gotrain.memsnap (kept so that programs written
against it run unchanged)."""

from gotrain.memsnap import available, restore, restore_into, snapshot, source, wait
from gotrain.dcp import reader as dcp_reader, writer as dcp_writer

__all__ = ["available", "restore", "restore_into", "snapshot", "source", "wait", "dcp_reader", "dcp_writer"]
