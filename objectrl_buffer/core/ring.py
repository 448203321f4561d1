"""The ring: which slot holds which row of a fixed-capacity buffer. The one place its arithmetic lives.

A ring of ``capacity`` slots holds ``size`` rows; ``pointer`` is the next slot written, so the newest
row sits at slot ``pointer - 1`` and the oldest at ``pointer - size`` (both mod ``capacity``). Rows are
also addressed by *position* (age order): position ``0`` is the oldest stored row, ``size - 1`` the
newest, whatever slot each one occupies after the ring wraps. Every room that keeps rows in a ring
(the replay buffer, prioritized replay, checkpoints, trajectory windows) asks this class, so the wrap
is written once.

``phantom`` counts rows that ``size`` includes but that hold no data: after a metadata-only checkpoint
load (ObjectRL's ``save``) the counters come back without the rows. Rows written later fill the ring
from ``pointer`` on, so the phantom rows are always the *oldest* ones and a write that wraps overwrites
them first; the rows that hold data are the newest ``held = size - phantom``.

Invariant: ``0 <= phantom <= size <= capacity`` and ``0 <= pointer < capacity``; before the first wrap
(``size < capacity``) also ``pointer == size``, unless a restored (metadata-only) checkpoint set
``pointer`` and ``size`` independently, which ObjectRL allows.
"""

from __future__ import annotations

import torch

__all__ = ["Ring", "spans"]


class Ring:
    """Ring state (``capacity``, ``size``, ``pointer``, ``phantom``) and the slot arithmetic over it.

    Args:
        capacity: number of slots (> 0; the caller validates it).

    The fields are plain ints, read and written directly on the per-step path.
    """

    __slots__ = ("begun", "capacity", "done", "phantom", "pointer", "size")

    def __init__(self, capacity: int, size: int = 0, pointer: int = 0, phantom: int = 0) -> None:
        self.capacity = capacity
        self.size = size
        self.pointer = pointer
        self.phantom = phantom
        # Rows whose write has begun / is done, counted since construction (a writer's seqlock; see
        # overwritten()). Equal when no write is under way; not part of state(): copies start at 0.
        self.begun = 0
        self.done = 0

    def __repr__(self) -> str:
        phantom = f", phantom={self.phantom}" if self.phantom else ""
        return f"Ring(capacity={self.capacity}, size={self.size}, pointer={self.pointer}{phantom})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ring) and self.state() == other.state()

    def state(self) -> tuple[int, int, int, int]:
        """``(capacity, size, pointer, phantom)``."""
        return self.capacity, self.size, self.pointer, self.phantom

    @property
    def held(self) -> int:
        """Rows that hold data: the newest ``size - phantom``."""
        return self.size - self.phantom

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ------------------------------------------------------------------ state changes
    def clear(self, capacity: int | None = None) -> None:
        """Empty the ring, optionally with a new capacity."""
        if capacity is not None:
            self.capacity = capacity
        self.size = self.pointer = self.phantom = 0

    def placement(self, n: int) -> tuple[int, int]:
        """Where a write of ``n`` rows at ``pointer`` lands, without moving the ring: ``(start, kept)``.

        When ``n > capacity`` only the newest ``capacity`` rows stay: they go to slots ``start, start + 1,
        ...`` (mod ``capacity``), ``kept`` of them (``0`` when ``n == 0``).
        """
        kept = min(n, self.capacity)
        return (self.pointer + n - kept) % self.capacity, kept

    def advance(self, n: int) -> tuple[int, int]:
        """Account for ``n`` rows written at ``pointer, pointer + 1, ...``; return :meth:`placement`."""
        capacity = self.capacity
        kept = n if n < capacity else capacity
        placed = (self.pointer + n - kept) % capacity, kept  # self.placement(n), inlined: per add_batch
        if self.phantom:  # rows past the capacity overwrite the oldest ones, phantom ones first
            self.phantom = max(0, self.phantom - max(0, self.size + n - capacity))
        self.pointer = (self.pointer + n) % capacity
        self.size = min(self.size + n, capacity)
        return placed

    def check(self) -> None:
        """Raise ``ValueError`` naming the field if the invariant does not hold."""
        if not 0 <= self.size <= self.capacity:
            raise ValueError(f"ring size {self.size} is outside [0, {self.capacity}]")
        if not 0 <= self.pointer < self.capacity:
            raise ValueError(f"ring pointer {self.pointer} is outside [0, {self.capacity})")
        if not 0 <= self.phantom <= self.size:
            raise ValueError(f"ring phantom {self.phantom} is outside [0, size={self.size}]")

    def overwritten(self, slots: torch.Tensor, done: int, pointer: int) -> torch.Tensor | None:
        """Which of ``slots`` (``[k]``, or ``[k, m]``: row ``i`` read slots ``slots[i]``) a write may have
        changed since ``done`` and ``pointer`` were read (in that order, before the slots were read), as a
        ``[k]`` bool mask; ``None`` when no write began since. The rows written since lie at ``pointer,
        pointer + 1, ...``, ``begun - done`` of them at most (the whole ring from ``capacity`` on)."""
        span = self.begun - done
        if span <= 0:
            return None
        if span >= self.capacity:
            return torch.ones(slots.shape[:1], dtype=torch.bool, device=slots.device)
        hit = (slots - pointer).remainder_(self.capacity) < span
        return hit if hit.dim() == 1 else hit.flatten(1).any(1)

    def held_under(self, pointer: int, size: int) -> int:
        """How many of the newest ``size`` rows would hold data if the counters became ``(pointer, size)``.

        The rows holding data now are the newest ``held`` (slots ``self.pointer - held .. self.pointer -
        1``). Under the new counters the newest row is slot ``pointer - 1``: if that slot holds data, the
        rows from it back to the oldest one holding data do (at most ``size``), else none. This is what a
        metadata-only checkpoint load keeps of the rows a buffer already has.
        """
        held = self.held
        if held == 0 or size == 0:
            return 0
        behind = (self.pointer - pointer) % self.capacity  # rows held now that are newer than the new newest
        return min(size, held - behind) if behind < held else 0

    # ------------------------------------------------------------------ slots and positions (rows held)
    @property
    def oldest(self) -> int:
        """Slot of the oldest row that holds data (the next one overwritten once the ring is full)."""
        return (self.pointer - self.held) % self.capacity

    @property
    def newest(self) -> int:
        """Slot of the newest row (``pointer - 1``); meaningless while ``held == 0``."""
        return (self.pointer - 1) % self.capacity

    def spans(self, start: int, n: int) -> tuple[tuple[int, int], ...]:
        """``n <= capacity`` slots from ``start`` on (mod ``capacity``) as one or two ``(lo, hi)`` ranges."""
        return spans(start, n, self.capacity)

    def window_spans(self, window: int | None = None) -> tuple[tuple[int, int], ...]:
        """The newest ``window`` rows held (all by default) as one or two slot ranges, oldest first."""
        count = self.held if window is None else min(window, self.held)
        return spans((self.pointer - count) % self.capacity, count, self.capacity)

    def slots(self, positions: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Slots of ``positions`` (``0`` = oldest) among the newest ``window`` rows held (all by default)."""
        count = self.held if window is None else min(window, self.held)
        return (positions + (self.pointer - count)).remainder_(self.capacity)

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """Age positions (``0`` = oldest row held) of ``slots``; the inverse of :meth:`slots`."""
        return (slots - self.oldest).remainder_(self.capacity)

    def chronological(self, device: torch.device | str, window: int | None = None) -> torch.Tensor:
        """Slots of the newest ``window`` rows held (all by default), oldest first (int64, on ``device``)."""
        count = self.held if window is None else min(window, self.held)
        start = (self.pointer - count) % self.capacity
        slots = torch.arange(start, start + count, device=device)
        return slots.remainder_(self.capacity) if start + count > self.capacity else slots

    def phantom_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Whether each of ``slots`` (counted rows) is a phantom one: among the oldest ``phantom`` counted."""
        return (slots - (self.pointer - self.size)).remainder_(self.capacity) < self.phantom

    def back(self, steps: torch.Tensor) -> torch.Tensor:
        """Slots ``steps`` rows back from the newest (``0`` is the newest row)."""
        return (self.pointer - 1 - steps).remainder_(self.capacity)

    def forward(self, slots: torch.Tensor, steps: torch.Tensor | int) -> torch.Tensor:
        """Slots ``steps`` rows after ``slots`` in write order (mod ``capacity``; a new tensor)."""
        return (slots + steps).remainder_(self.capacity)

    def span_slots(self, start: int, n: int, device: torch.device | str) -> torch.Tensor:
        """The ``n <= capacity`` slots ``start, start + 1, ...`` (mod ``capacity``) as an int64 tensor."""
        return torch.arange(start, start + n, device=device).remainder_(self.capacity)


def spans(start: int, n: int, capacity: int) -> tuple[tuple[int, int], ...]:
    """``n <= capacity`` slots from ``start`` on (mod ``capacity``) as one or two ``(lo, hi)`` ranges."""
    head = min(n, capacity - start)
    if head >= n:
        return ((start, start + n),)
    return ((start, capacity), (0, n - head))
