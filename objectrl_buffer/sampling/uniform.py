"""Which slots to read: uniform draws, recency windows and epochs. Small pure functions of the ring.

State lives in the buffer (a :class:`~objectrl_buffer.core.ring.Ring`); these functions only compute
index tensors from it, so each one is easy to test against a plain Python model of the ring. Every
one of them reads only the rows that hold data (``ring.held``, the newest rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import StaleIteratorError

T = TypeVar("T")

__all__ = ["num_batches", "uniform_slots", "epoch_slots", "recent_slots", "epoch_batches", "epochs"]


def num_batches(n_rows: int, batch_size: int) -> int:
    """``ceil(n_rows / batch_size)``: batches in one epoch, the last one possibly partial."""
    return -(-n_rows // batch_size)


def uniform_slots(size: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` slots drawn uniformly with replacement from ``[0, size)``, on the generator's device."""
    return torch.randint(0, size, (k,), generator=generator, device=generator.device)


def recent_slots(ring: Ring, window: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` slots drawn uniformly with replacement from the newest ``min(window, held)`` rows."""
    back = torch.randint(0, min(window, ring.held), (k,), generator=generator, device=generator.device)
    return ring.back(back)


def epoch_slots(size: int, batch_size: int, shuffle: bool, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """One epoch over ``[0, size)`` in batches of ``batch_size`` (the last one partial).

    Without ``shuffle`` the order is slot order (ObjectRL's); with it a fresh permutation drawn from
    ``generator`` when the epoch starts. Every slot appears exactly once.
    """
    device = generator.device
    order = torch.randperm(size, generator=generator, device=device) if shuffle else torch.arange(size, device=device)
    for start in range(0, size, batch_size):
        yield order[start : start + batch_size]


def epoch_batches(
    size: int, batch_size: int, shuffle: bool, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, tuple[int, int] | None]]:
    """One epoch over positions ``0 .. size-1`` as ``(positions, span)`` batches.

    Shuffled: a fresh permutation (``span`` is ``None``). In order (ObjectRL's slot order): contiguous
    ranges, with ``span = (start, stop)`` so the reader can copy a slice instead of gathering (~2x faster).
    """
    if shuffle:
        for positions in epoch_slots(size, batch_size, True, generator):
            yield positions, None
        return
    for start in range(0, size, batch_size):
        stop = min(start + batch_size, size)
        yield torch.arange(start, stop), (start, stop)


def epochs(
    read: Callable[[torch.Tensor, tuple[int, int] | None], T],
    size: int,
    batch_size: int,
    n_epochs: int,
    shuffle: bool,
    generator: torch.Generator,
    current: Callable[[], bool],
) -> Iterator[T]:
    """``n_epochs`` epochs of :func:`epoch_batches`, each batch read by ``read(positions, span)`` when it is
    yielded; :class:`StaleIteratorError` once ``current()`` says the rows were dropped since."""
    for _ in range(n_epochs):
        for positions, span in epoch_batches(size, batch_size, shuffle, generator):
            if not current():
                raise StaleIteratorError("the buffer was reset after this epoch iterator was created")
            yield read(positions, span)
