"""Which slots to read: small pure functions over ring state (pointer, size, capacity).

State lives in the buffer; these functions only compute index tensors from it, so each one is easy
to test against a plain Python model of the ring.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = [
    "num_batches",
    "uniform_slots",
    "chronological_slots",
    "epoch_slots",
    "recent_slots",
    "window_slots",
    "rows_still_held",
]


def num_batches(n_rows: int, batch_size: int) -> int:
    """``ceil(n_rows / batch_size)``: batches in one epoch, the last one possibly partial."""
    return -(-n_rows // batch_size)


def uniform_slots(size: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` slots drawn uniformly with replacement from ``[0, size)``, on the generator's device."""
    return torch.randint(0, size, (k,), generator=generator, device=generator.device)


def chronological_slots(pointer: int, size: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Slots of the ``size`` stored rows, oldest first.

    Before the ring wraps (``size < capacity``) that is ``0 .. size-1``; after, the oldest row sits at
    ``pointer`` (the next slot to be overwritten) and the newest at ``pointer - 1``.
    """
    start = (pointer - size) % capacity
    slots = torch.arange(start, start + size, device=device)
    return slots.remainder_(capacity) if start + size > capacity else slots


def epoch_slots(size: int, batch_size: int, shuffle: bool, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """One epoch over ``[0, size)`` in batches of ``batch_size`` (the last one partial).

    Without ``shuffle`` the order is slot order (ObjectRL's); with it a fresh permutation drawn from
    ``generator`` when the epoch starts. Every slot appears exactly once.
    """
    device = generator.device
    order = torch.randperm(size, generator=generator, device=device) if shuffle else torch.arange(size, device=device)
    for start in range(0, size, batch_size):
        yield order[start : start + batch_size]


def recent_slots(
    pointer: int, size: int, capacity: int, window: int, k: int, generator: torch.Generator
) -> torch.Tensor:
    """``k`` slots drawn uniformly with replacement from the newest ``min(window, size)`` rows.

    The newest row sits at slot ``pointer - 1``; going back ``j`` rows is slot ``pointer - 1 - j``
    (mod ``capacity``), which stays among the stored rows for ``j < size``.
    """
    back = torch.randint(0, min(window, size), (k,), generator=generator, device=generator.device)
    return (pointer - 1 - back).remainder_(capacity)


def window_slots(pointer: int, size: int, capacity: int, window: int, device: torch.device) -> torch.Tensor:
    """Slots of the newest ``min(window, size)`` rows, oldest first."""
    return chronological_slots(pointer, min(window, size), capacity, device)


def rows_still_held(old_pointer: int, old_held: int, pointer: int, size: int, capacity: int) -> int:
    """How many of the newest ``size`` rows under new counters (``pointer``) hold data that was written.

    The rows written are the newest ``old_held`` under the old counters: slots ``old_pointer - old_held ..
    old_pointer - 1``. Under the new ones the newest row is slot ``pointer - 1``; if that slot is among
    those written, the rows from it back to the first written one hold data (at most ``size``), else none.
    """
    if old_held == 0 or size == 0:
        return 0
    behind = (old_pointer - pointer) % capacity  # written rows newer than the new newest row
    return min(size, old_held - behind) if behind < old_held else 0
