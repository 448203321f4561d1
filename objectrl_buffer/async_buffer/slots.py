"""The slot table of an :class:`~objectrl_buffer.async_buffer.buffer.AsyncSequenceBuffer`.

A few preallocated tensors of ``max_size`` rows (occupancy, ids, birth times, key presence, readiness and
read bits per consumer), the payload of each slot, and two structures that change by the batch of each
operation so that none scans ``max_size`` rows: per consumer the slots ready for it and unread by it, and a
min-heap of the free slots.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from objectrl_buffer.errors import InconsistentStateError

__all__ = ["SlotTable", "EMPTY_ID", "require"]

#: The int id no entry may have (it marked an empty slot in files of format 1; int ids stay int64 tensors).
EMPTY_ID = -1


def require(ok: bool, problem: str) -> None:
    """Raise :class:`InconsistentStateError` naming ``problem`` unless ``ok``."""
    if not ok:
        raise InconsistentStateError(f"AsyncSequenceBuffer state is inconsistent: {problem}")


class SlotTable:
    """The state of ``max_size`` slots read by ``n_consumers`` consumers, ``n_tracked`` readiness keys each.

    Tensors (CPU): ``occupied [m]`` bool, ``birth [m]`` int64, ``has [m, n_tracked]``, ``ready [m, n_consumers]``
    and ``read [m, n_consumers]`` bool. Per slot in Python lists: its entry's id (``None`` when empty; any
    hashable) and payload.
    """

    def __init__(self, max_size: int, n_consumers: int, n_tracked: int) -> None:
        m, c = max_size, n_consumers
        # NumPy arrays for the per-operation updates (a NumPy op on a few rows costs ~1 us, a torch op ~5: the
        # bookkeeping of AReaL's pipeline, issue 26), with torch views of the same memory for everything else.
        self.np_occupied = np.zeros(m, dtype=np.bool_)
        self.np_birth = np.zeros(m, dtype=np.int64)
        self.np_has = np.zeros((m, n_tracked), dtype=np.bool_)
        self.np_ready = np.zeros((m, c), dtype=np.bool_)
        self.np_read = np.zeros((m, c), dtype=np.bool_)
        self.occupied = torch.from_numpy(self.np_occupied)
        self.birth = torch.from_numpy(self.np_birth)
        self.has = torch.from_numpy(self.np_has)
        self.ready = torch.from_numpy(self.np_ready)
        self.read = torch.from_numpy(self.np_read)
        self.ids: list[Hashable | None] = [None] * m
        # Per consumer, the slots ready for it and not yet read by it; and a min-heap of the free slots.
        # Both change by the batch of each operation, so no operation scans max_size rows.
        self.candidates: list[set[int]] = [set() for _ in range(c)]
        self.free_slots = list(range(m))  # sorted, hence a heap
        self.payload: list[dict[str, Any] | None] = [None] * m
        self.slot_of: dict[Hashable, int] = {}
        self.size = 0
        self.last_birth = 0
        self.consumed: list[Hashable] = []
        # How often each id was put: an id consumed and then put again (AReaL puts the same ids every
        # epoch) is a new entry, so an id may be consumed once per put, not once in all.
        self.puts: Counter[Hashable] = Counter()

    def add_candidates(self, slots: list[int], ready: np.ndarray | torch.Tensor) -> None:
        """Add ``slots[i]`` to consumer ``c``'s candidates where ``ready[i, c]`` (bool ``[n, n_consumers]``, or
        one row ``[n_consumers]`` for all)."""
        if ready.ndim == 1:
            for c, r in enumerate(ready.tolist()):
                if r:
                    self.candidates[c].update(slots)
            return
        if ready.any():
            for c, column in enumerate(ready.T.tolist()):
                self.candidates[c].update(s for s, r in zip(slots, column, strict=True) if r)

    def pop_free(self, n: int) -> list[int]:
        """Take the ``n`` lowest free slots (the caller checked that ``n`` are free)."""
        return [heapq.heappop(self.free_slots) for _ in range(n)]

    def oldest(self, c: int, n: int) -> np.ndarray:
        """The ``n`` oldest slots (birth time, then slot) ready for consumer ``c`` and unread by it, oldest first
        (int64 ``[n]``)."""
        candidates = np.fromiter(self.candidates[c], dtype=np.int64, count=len(self.candidates[c]))
        births = self.np_birth[candidates]
        if candidates.size > n:
            # Keep every candidate born no later than the n-th oldest (ties included), then order exactly.
            cutoff = births[np.argpartition(births, n - 1)[n - 1]]
            keep = births <= cutoff
            candidates, births = candidates[keep], births[keep]
        return candidates[np.lexsort((candidates, births))[:n]]  # by birth, ties by slot

    def free(self, slots: np.ndarray) -> list[Hashable]:
        """Empty ``slots`` (int64 ``[k]``, occupied), add their ids to the consumed list and return those ids."""
        ids = []
        for slot in slots.tolist():
            sample_id = self.ids[slot]
            ids.append(sample_id)
            self.ids[slot] = None
            self.payload[slot] = None
            del self.slot_of[sample_id]
            heapq.heappush(self.free_slots, slot)
        self.consumed.extend(ids)
        self.np_occupied[slots] = False
        self.np_birth[slots] = 0
        self.np_has[slots] = False
        self.np_ready[slots] = False
        self.np_read[slots] = False
        self.size -= len(slots)
        return ids

    def check(self, names: list[str]) -> None:
        """Check the table's pieces against each other (``names``: the consumers, in column order).

        Raises:
            InconsistentStateError: naming the first inconsistency found.
        """
        occ = self.occupied
        require(int(occ.sum()) == self.size, f"size {self.size} but {int(occ.sum())} slots occupied")
        require(len(self.slot_of) == self.size, f"size {self.size} but {len(self.slot_of)} ids indexed")
        held = [s for s, p in enumerate(self.payload) if p is not None]
        require(held == occ.nonzero().squeeze(1).tolist(), "payloads held do not match the occupied slots")
        empty = ~occ
        require(all(self.ids[s] is None for s in empty.nonzero().squeeze(1).tolist()), "an empty slot keeps an id")
        require(
            not bool(self.has[empty].any() | self.ready[empty].any() | self.read[empty].any()),
            "an empty slot keeps key, ready or read bits",
        )
        require(bool((self.birth[empty] == 0).all()), "an empty slot keeps a birth time")
        require(bool((self.birth[occ] <= self.last_birth).all()), "a birth time is after the last one given")
        require(not bool(self.read[occ].all(1).any()), "an entry read by every consumer was not freed")
        for c, name in enumerate(names):
            ready = (occ & self.ready[:, c] & ~self.read[:, c]).nonzero().squeeze(1).tolist()
            require(set(ready) == self.candidates[c], f"the slots ready for '{name}' differ from its candidates")
        require(sorted(self.free_slots) == empty.nonzero().squeeze(1).tolist(), "free slots differ from empty ones")
        require(
            all(self.free_slots[(i - 1) // 2] <= v for i, v in enumerate(self.free_slots) if i),
            "the free slots are not a heap",
        )
        for sample_id, slot in self.slot_of.items():
            require(bool(occ[slot]) and self.ids[slot] == sample_id, f"id {sample_id!r} indexed at slot {slot}")
        stored = Counter(self.slot_of.keys())  # keys: a mapping would give its values as counts
        require(
            Counter(self.consumed) + stored == self.puts,
            "an id was consumed twice (consumed more often than put, or put and never stored or consumed)",
        )
