"""gotrain's Python package: what PyTorch programs use of gotrain.

    import gotrain
    state, step = gotrain.restore_into({"model": model, "opt": opt}) or (None, 0)
    ...
    gotrain.snapshot({"model": model, "opt": opt}, step)

gotrain.memsnap holds the in-memory snapshot tier (snapshot, restore,
restore_into), gotrain.dcp its torch.distributed.checkpoint storage. Under
plain python or torchrun everything imports and does nothing: snapshot()
returns False and the restores None. Standard library and torch only; torch
is imported on first use, not here.
"""

__version__ = "0.9.0"

from .memsnap import available, restore, restore_into, snapshot, source, wait  # noqa: E402
from . import dcp  # noqa: E402

__all__ = ["available", "restore", "restore_into", "snapshot", "source", "wait", "dcp"]
