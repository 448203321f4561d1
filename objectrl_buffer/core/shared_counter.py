"""Slots reserved across processes: a 64-bit counter and per-slot commit generations in one shared file.

The file holds ``1 + capacity`` int64 values, mapped ``MAP_SHARED`` by every process that opens it:
``[0]`` counts rows ever reserved, ``[1 + s]`` is the commit generation of slot ``s``: ``seq + 1`` of the row
committed there (``seq``: its number among all rows ever reserved), or 0 while nothing finished is there.

* :meth:`SharedSlots.reserve` bumps the counter under :func:`~objectrl_buffer.core.sync.lock_file` (a
  ``flock`` the kernel releases if its holder dies); the lock covers only the increment, never a copy.
* A writer :meth:`~SharedSlots.begin` s its slots (generation 0), copies its rows, then
  :meth:`~SharedSlots.commit` s them (``seq + 1``).
* A reader takes the generations before (:meth:`~SharedSlots.generations`) and after reading rows, and keeps
  a row only if both are equal and > 0 (a per-slot seqlock): it never sees a row being written, and a
  writer that dies mid-write (even by SIGKILL) leaves its slots at 0: skipped, never waited for.

Stores to the mapping are plain aligned 8-byte stores, ordered as issued on x86-64 (TSO).
"""

from __future__ import annotations

import os

import torch

from objectrl_buffer.core.sync import lock_file

__all__ = ["SharedSlots"]


class SharedSlots:
    """The shared reserve counter and commit generations of ``capacity`` slots, in the file ``path``.

    Args:
        path: the shared file (created with zeros when ``create``; it must exist otherwise).
        capacity: slots (> 0).
        create: make the file (it must not exist).
    """

    def __init__(self, path: str, capacity: int, *, create: bool = False) -> None:
        self.path, self.capacity = path, capacity
        if create:
            with open(path, "xb") as f:
                f.truncate(8 * (1 + capacity))
        elif os.path.getsize(path) != 8 * (1 + capacity):
            raise ValueError(f"'{path}' does not hold {capacity} slots")
        self._words = torch.from_file(path, shared=True, size=1 + capacity, dtype=torch.int64)
        self.gens = self._words[1:]

    @property
    def reserved(self) -> int:
        """Rows ever reserved (by every process)."""
        return int(self._words[0])

    def reserve(self, n: int) -> int:
        """Reserve ``n`` rows: return the ``seq`` of the first (the next ``n`` are this caller's)."""
        with lock_file(self.path + ".lock"):
            start = int(self._words[0])
            self._words[0] = start + n
        return start

    def begin(self, slots: torch.Tensor) -> None:
        """Mark ``slots`` (int64) as being written: readers skip them from now on."""
        self.gens.index_fill_(0, slots, 0)  # index_copy_/index_fill_: advanced-index stores are ~1000x slower

    def commit(self, slots: torch.Tensor, seqs: torch.Tensor) -> None:
        """Publish the rows ``seqs`` (int64, one per slot) written at ``slots``."""
        self.gens.index_copy_(0, slots, seqs + 1)

    def generations(self, slots: torch.Tensor) -> torch.Tensor:
        """A copy of the commit generations of ``slots``."""
        return self.gens.index_select(0, slots)

    def committed(self) -> int:
        """Slots holding a finished row."""
        return int((self.gens > 0).sum())
