"""Slots reserved across processes: a 64-bit counter and per-slot commit generations in one shared file.

The file holds ``1 + capacity`` int64 values, mapped ``MAP_SHARED`` by every process that opens it:
``[0]`` counts rows ever reserved, ``[1 + s]`` is the commit generation of slot ``s``: ``seq + 1`` of the row
committed there (``seq``: its number among all rows ever reserved), or 0 while nothing finished is there.

* :meth:`SharedSlots.reserve` bumps the counter with one atomic fetch-add (:mod:`objectrl_buffer.core.atomic`:
  ~0.35 us, nothing held, nothing to release if the caller dies; two writers on two cores never put each other
  to sleep). Where this machine has no lock-free atomics it takes a :class:`~objectrl_buffer.core.sync.FileLock`
  on the file instead (a ``flock`` the kernel releases if its holder dies: ~1.1 us, ~3 us contended); every
  process on one machine makes the same choice. Either way the copy is never under a lock.
* A writer :meth:`~SharedSlots.begin` s its slots (generation 0), copies its rows, then
  :meth:`~SharedSlots.commit` s them (``seq + 1``).
* A reader takes the generations before (:meth:`~SharedSlots.generations`) and after reading rows, and keeps
  a row only if both are equal and > 0 (a per-slot seqlock): it never sees a row being written, and a
  writer that dies mid-write (even by SIGKILL) leaves its slots at 0: skipped, never waited for. That holds
  while one writer at a time holds a slot; a writer lapped inside its copy (``capacity`` rows reserved
  meanwhile) shares its slot with a newer one, which no generation can show: the shared ring adds the
  writes-in-flight table and taints of :mod:`objectrl_buffer.core.inflight` for that.

Stores to the mapping are plain aligned 8-byte stores, ordered as issued on x86-64 (TSO). Single slots go
through a NumPy view of the mapping (~0.1 us a store; a torch index op costs ~2-5 us).
"""

from __future__ import annotations

import os

import torch

from objectrl_buffer.core import atomic
from objectrl_buffer.core.sync import FileLock

__all__ = ["SharedSlots"]


class SharedSlots:
    """The shared reserve counter and commit generations of ``capacity`` slots, in the file ``path``.

    Args:
        path: the shared file (created with zeros when ``create``; it must exist otherwise).
        capacity: slots (> 0).
        create: make the file (it must not exist).
        start: with ``create``: the counter's first value (so that ``start % capacity`` is the first slot).
    """

    def __init__(self, path: str, capacity: int, *, create: bool = False, start: int = 0) -> None:
        self.path, self.capacity = path, capacity
        if create:
            with open(path, "xb") as f:
                f.truncate(8 * (1 + capacity))
                if start:
                    f.write(int(start).to_bytes(8, "little", signed=True))
        elif os.path.getsize(path) != 8 * (1 + capacity):
            raise ValueError(f"'{path}' does not hold {capacity} slots")
        words = torch.from_file(path, shared=True, size=1 + capacity, dtype=torch.int64)
        self.gens = words[1:]
        self.words = words.numpy()  # the same memory: scalar loads and stores at NumPy's cost
        self._words = words  # keeps the mapping alive under the atomic's raw address
        self.counter = atomic.load(words.data_ptr())
        self.lock = FileLock(path)

    @property
    def reserved(self) -> int:
        """Rows ever reserved (by every process)."""
        return int(self.words[0])

    def reserve(self, n: int) -> int:
        """Reserve ``n`` rows: return the ``seq`` of the first (the next ``n`` are this caller's)."""
        if self.counter is not None:
            return self.counter.fetch_add(n)
        lock, words = self.lock, self.words
        lock.acquire()
        try:
            start = int(words[0])
            words[0] = start + n
        finally:
            lock.release()
        return start

    def unreserve(self, start: int, n: int) -> bool:
        """Give back the ``n`` rows from ``start`` if nobody reserved after them; ``False`` (spent) otherwise."""
        if self.counter is not None:
            return self.counter.compare_exchange(start + n, start)
        lock, words = self.lock, self.words
        lock.acquire()
        try:
            if int(words[0]) != start + n:
                return False
            words[0] = start
            return True
        finally:
            lock.release()

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
