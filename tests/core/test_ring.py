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


def test_phantom_rows_are_the_oldest_counted_and_writes_replace_them_first() -> None:
    ring = Ring(6, size=6, pointer=2, phantom=4)  # counted: slots 2,3,4,5,0,1 oldest first; held: 0, 1
    assert ring.held == 2 and ring.oldest == 0
    assert ring.phantom_mask(torch.arange(6)).tolist() == [False, False, True, True, True, True]
    assert ring.chronological("cpu").tolist() == [0, 1]
    ring.advance(3)  # overwrites slots 2, 3, 4: three phantom rows
    assert (ring.phantom, ring.held, ring.pointer) == (1, 5, 5)
    assert ring.phantom_mask(torch.arange(6)).tolist() == [False, False, False, False, False, True]
    ring.advance(10)
    assert ring.phantom == 0 and ring.held == 6
    ring.check()


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 8), phantom=st.integers(0, 8), writes=st.lists(st.integers(0, 10), max_size=6))
def test_phantom_rows_match_a_list_model(capacity: int, phantom: int, writes: list[int]) -> None:
    """A full ring whose oldest ``phantom`` rows hold no data: the model is a list of (slot, holds data)."""
    phantom = min(phantom, capacity)
    ring = Ring(capacity, size=capacity, pointer=0, phantom=phantom)
    model = [(s, s >= phantom) for s in range(capacity)]  # oldest first
    written = 0
    for n in writes:
        ring.advance(n)
        for _ in range(n):
            model = [*model[1:], (written % capacity, True)]
            written += 1
        assert ring.held == sum(held for _, held in model)
        assert ring.chronological("cpu").tolist() == [s for s, held in model if held]
        mask = ring.phantom_mask(torch.tensor([s for s, _ in model]))
        assert mask.tolist() == [not held for _, held in model]
