"""Ring arithmetic against a plain Python model: a list of (slot, row) in write order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.core.ring import Ring


class ListModel:
    """The newest ``capacity`` of every row ever written, oldest first, each with its slot."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.written = 0
        self.rows: list[int] = []  # slots, oldest first

    def write(self, n: int) -> list[int]:
        slots = [(self.written + i) % self.capacity for i in range(n)]
        self.written += n
        self.rows = (self.rows + slots)[-self.capacity :]
        return slots


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 9), writes=st.lists(st.integers(0, 20), max_size=12), window=st.integers(1, 12))
def test_ring_matches_a_list_of_written_rows(capacity: int, writes: list[int], window: int) -> None:
    ring, model = Ring(capacity), ListModel(capacity)
    for n in writes:
        slots = model.write(n)
        start, kept = ring.advance(n)
        assert kept == min(n, capacity)
        assert [(start + i) % capacity for i in range(kept)] == slots[len(slots) - kept :]
        covered = [s for lo, hi in ring.spans(start, kept) for s in range(lo, hi)]
        assert covered == slots[len(slots) - kept :]
        ring.check()
        assert ring.size == len(model.rows)
        assert ring.chronological("cpu").tolist() == model.rows
        assert ring.chronological("cpu", window).tolist() == model.rows[-window:]
        if model.rows:
            assert ring.oldest == model.rows[0]
            assert ring.newest == model.rows[-1]
            positions = torch.arange(ring.size)
            assert ring.slots(positions).tolist() == model.rows
            assert ring.positions(ring.slots(positions)).tolist() == positions.tolist()
            assert ring.back(torch.arange(ring.size)).tolist() == model.rows[::-1]
            w = min(window, ring.size)
            assert ring.slots(torch.arange(w), window).tolist() == model.rows[-w:]


def test_check_names_the_broken_field() -> None:
    with pytest.raises(ValueError, match="pointer"):
        Ring(4, 2, 4).check()
    with pytest.raises(ValueError, match="size"):
        Ring(4, 5, 0).check()


def test_clear_keeps_or_changes_capacity() -> None:
    ring = Ring(4)
    ring.advance(6)
    ring.clear()
    assert ring == Ring(4)
    ring.clear(7)
    assert ring == Ring(7)
