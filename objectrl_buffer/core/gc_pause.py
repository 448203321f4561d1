"""Pause Python's cyclic garbage collector around a burst of allocations.

Storing a batch of rows allocates many small containers that all survive (they are the stored rows); each
collection the burst triggers traverses them again, for nothing, and the cost grows with everything already
held. Reference counting still frees everything as usual; only the cycle detector waits until the end.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable automatic cyclic GC inside the block; re-enable it on exit (also on an exception) only if this
    block disabled it, so a caller that had turned it off keeps it off, and nested blocks are fine."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
