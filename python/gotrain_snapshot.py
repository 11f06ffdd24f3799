"""gotrain_snapshot: the name earlier gotrain versions gave the snapshot
module; the same API as gotrain.memsnap (kept so that programs written
against it run unchanged)."""

from gotrain.memsnap import available, restore, restore_into, snapshot, source, wait  # noqa: F401
from gotrain.dcp import reader as dcp_reader, writer as dcp_writer  # noqa: F401
