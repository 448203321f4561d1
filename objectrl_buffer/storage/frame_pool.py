"""A first-in first-out pool of whole observations that a compact storage cannot borrow from its frames.

:class:`~objectrl_buffer.storage.compact.CompactStorage` keeps one frame per env step; the few values that
are not made of those frames (a stacked observation at an episode start, with its reset padding; the
``next_state`` of an episode end) go here. Entries are appended in write order and named by an ever
growing id; each says the last env step whose row may read it, and entries leave from the oldest end once
no live row can read them. So the pool holds about one entry per episode in the buffer: it starts small
and doubles when full (entry ``id`` lives at slot ``id % capacity``; growing re-places the live ones).
"""

from __future__ import annotations

from collections import deque

import torch

__all__ = ["FramePool"]

#: Entries of a new pool: a few episodes' worth, so that a small buffer's pool stays small.
INITIAL_ENTRIES = 4


class FramePool:
    """Whole values ``[*shape]`` of ``dtype`` on ``device``, addressed by id (see the module docs)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.data = torch.empty((INITIAL_ENTRIES, *shape), dtype=dtype, device=device)
        self.head = 0  # id of the next entry
        self.tail = 0  # id of the oldest live entry
        #: Per live entry, oldest first: the last env step whose row may read it (entries leave once the
        #: first is below the oldest live step: see :meth:`expire`).
        self.expiry: deque[int] = deque()

    @property
    def capacity(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def clear(self) -> None:
        """Drop every entry and shrink back to the initial size."""
        self.data = torch.empty((INITIAL_ENTRIES, *self.shape), dtype=self.dtype, device=self.device)
        self.head = self.tail = 0
        self.expiry.clear()

    def expire(self, oldest_step: int) -> None:
        """Drop the oldest entries that no row of env step ``oldest_step`` or newer reads."""
        last = self.expiry
        while last and last[0] < oldest_step:
            last.popleft()
            self.tail += 1

    def push(self, values: torch.Tensor, last_steps: torch.Tensor) -> torch.Tensor:
        """Append ``values`` ``[m, *shape]`` whose rows are read up to env steps ``last_steps`` ``[m]``;
        return their ids (int64 ``[m]`` on ``device``)."""
        m = values.shape[0]
        ids = torch.arange(self.head, self.head + m, device=self.device)
        if m == 0:
            return ids
        live = self.head - self.tail
        if live + m > self.capacity:
            self._grow(live + m)
        self.data.index_copy_(0, ids % self.capacity, values.to(self.device, self.dtype))
        self.expiry.extend(last_steps.tolist())
        self.head += m
        return ids

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        data = torch.empty((capacity, *self.shape), dtype=self.dtype, device=self.device)
        live = torch.arange(self.tail, self.head, device=self.device)
        data.index_copy_(0, live % capacity, self.data.index_select(0, live % self.capacity))
        self.data = data

    def slots(self, ids: torch.Tensor) -> torch.Tensor:
        """Where entries ``ids`` lie in :attr:`data`."""
        return ids % self.capacity

    def state(self) -> tuple[torch.Tensor, list[int], int]:
        """``(live entries oldest first, their last steps, id of the oldest)``, for checkpoints."""
        live = torch.arange(self.tail, self.head, device=self.device)
        return self.data.index_select(0, live % self.capacity), list(self.expiry), self.tail

    def restore(self, values: torch.Tensor, last_steps: list[int], tail: int) -> None:
        """Adopt :meth:`state`'s output."""
        self.clear()
        self.head = self.tail = tail
        self.push(values, torch.tensor(last_steps, dtype=torch.int64))
