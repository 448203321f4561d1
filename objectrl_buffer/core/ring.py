"""The ring: which slot holds which row of a fixed-capacity buffer. The one place its arithmetic lives.

A ring of ``capacity`` slots holds ``size`` rows; ``pointer`` is the next slot written, so the newest
row sits at slot ``pointer - 1`` and the oldest at ``pointer - size`` (both mod ``capacity``). Rows are
also addressed by *position* (age order): position ``0`` is the oldest stored row, ``size - 1`` the
newest, whatever slot each one occupies after the ring wraps. Every room that keeps rows in a ring
(the replay buffer, prioritized replay, checkpoints, trajectory windows) asks this class, so the wrap
is written once.

Invariant: ``0 <= size <= capacity`` and ``0 <= pointer < capacity``; before the first wrap
(``size < capacity``) also ``pointer == size``, unless a restored (metadata-only) checkpoint set
``pointer`` and ``size`` independently, which ObjectRL allows.
"""

from __future__ import annotations

import torch

__all__ = ["Ring"]


class Ring:
    """Ring state (``capacity``, ``size``, ``pointer``) and the slot arithmetic over it.

    Args:
        capacity: number of slots (> 0; the caller validates it).

    The fields are plain ints, read and written directly on the per-step path.
    """

    __slots__ = ("capacity", "pointer", "size")

    def __init__(self, capacity: int, size: int = 0, pointer: int = 0) -> None:
        self.capacity = capacity
        self.size = size
        self.pointer = pointer

    def __repr__(self) -> str:
        return f"Ring(capacity={self.capacity}, size={self.size}, pointer={self.pointer})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ring) and (self.capacity, self.size, self.pointer) == (
            other.capacity,
            other.size,
            other.pointer,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ------------------------------------------------------------------ state changes
    def clear(self, capacity: int | None = None) -> None:
        """Empty the ring, optionally with a new capacity."""
        if capacity is not None:
            self.capacity = capacity
        self.size = self.pointer = 0

    def advance(self, n: int) -> tuple[int, int]:
        """Account for ``n`` rows written at ``pointer, pointer + 1, ...``; return ``(start, kept)``.

        When ``n > capacity`` only the newest ``capacity`` rows stay: they went to slots ``start,
        start + 1, ...`` (mod ``capacity``), ``kept`` of them (``0`` when ``n == 0``).
        """
        capacity = self.capacity
        kept = min(n, capacity)
        start = (self.pointer + n - kept) % capacity
        self.pointer = (self.pointer + n) % capacity
        self.size = min(self.size + n, capacity)
        return start, kept

    def check(self) -> None:
        """Raise ``ValueError`` naming the field if the invariant does not hold."""
        if not 0 <= self.size <= self.capacity:
            raise ValueError(f"ring size {self.size} is outside [0, {self.capacity}]")
        if not 0 <= self.pointer < self.capacity:
            raise ValueError(f"ring pointer {self.pointer} is outside [0, {self.capacity})")

    # ------------------------------------------------------------------ slots and positions
    @property
    def oldest(self) -> int:
        """Slot of the oldest row (the next one overwritten once the ring is full)."""
        return (self.pointer - self.size) % self.capacity

    @property
    def newest(self) -> int:
        """Slot of the newest row (``pointer - 1``); meaningless while ``size == 0``."""
        return (self.pointer - 1) % self.capacity

    def spans(self, start: int, n: int) -> tuple[tuple[int, int], ...]:
        """``n <= capacity`` slots from ``start`` on (mod ``capacity``) as one or two ``(lo, hi)`` ranges."""
        head = min(n, self.capacity - start)
        if head >= n:
            return ((start, start + n),)
        return ((start, self.capacity), (0, n - head))

    def slots(self, positions: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Slots of ``positions`` (``0`` = oldest) among the newest ``window`` rows (all by default)."""
        size = self.size if window is None else min(window, self.size)
        return (positions + (self.pointer - size)).remainder_(self.capacity)

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """Age positions (``0`` = oldest stored row) of ``slots``; the inverse of :meth:`slots`."""
        return (slots - self.oldest).remainder_(self.capacity)

    def chronological(self, device: torch.device | str, window: int | None = None) -> torch.Tensor:
        """Slots of the newest ``window`` rows (all by default), oldest first (int64, on ``device``)."""
        size = self.size if window is None else min(window, self.size)
        start = (self.pointer - size) % self.capacity
        slots = torch.arange(start, start + size, device=device)
        return slots.remainder_(self.capacity) if start + size > self.capacity else slots

    def back(self, steps: torch.Tensor) -> torch.Tensor:
        """Slots ``steps`` rows back from the newest (``0`` is the newest row)."""
        return (self.pointer - 1 - steps).remainder_(self.capacity)
