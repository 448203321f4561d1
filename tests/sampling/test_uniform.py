"""sampling.uniform: slot choice over ring state, checked against plain Python models (the ring's own
arithmetic is tested in tests/core/test_ring.py)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import StaleIteratorError
from objectrl_buffer.sampling.uniform import (
    epoch_batches,
    epoch_slots,
    epochs,
    num_batches,
    recent_slots,
    uniform_slots,
)


def ring_states(max_capacity: int) -> list[tuple[int, int, int]]:
    """Every consistent (pointer, size, capacity): before the wrap pointer == size, after it size == capacity."""
    states = []
    for capacity in range(1, max_capacity + 1):
        states += [(size % capacity, size, capacity) for size in range(capacity + 1)]
        states += [(pointer, capacity, capacity) for pointer in range(capacity)]
    return states


def reference_chronological(pointer: int, size: int, capacity: int) -> list[int]:
    """Add rows 0, 1, 2, ... one by one into a list ring; read back the slots of the stored rows by age."""
    for total in range(size, size + 3 * capacity + 1):  # any history that ends in this state
        if min(total, capacity) == size and total % capacity == pointer:
            slot_of_row = {row: row % capacity for row in range(total)}
            live = sorted(slot_of_row)[-size:] if size else []
            return [slot_of_row[row] for row in live]
    raise AssertionError("inconsistent state")


@pytest.mark.parametrize(("pointer", "size", "capacity"), ring_states(7))
def test_chronological_slots_match_the_reference(pointer: int, size: int, capacity: int) -> None:
    slots = Ring(capacity, size, pointer).chronological(torch.device("cpu"))
    assert slots.dtype == torch.int64 and slots.device.type == "cpu"
    assert slots.tolist() == reference_chronological(pointer, size, capacity)


def test_chronological_slots_examples() -> None:
    cpu = torch.device("cpu")
    assert Ring(10, 10, 5).chronological(cpu).tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert Ring(10, 10, 0).chronological(cpu).tolist() == list(range(10))
    assert Ring(10, 3, 3).chronological(cpu).tolist() == [0, 1, 2]
    assert Ring(4, 0, 0).chronological(cpu).tolist() == []


@pytest.mark.parametrize("n_rows", [0, 1, 2, 7, 8, 9, 100])
@pytest.mark.parametrize("batch_size", [1, 3, 8, 256])
def test_num_batches_is_ceil(n_rows: int, batch_size: int) -> None:
    assert num_batches(n_rows, batch_size) == math.ceil(n_rows / batch_size)


def test_uniform_slots_range_shape_and_generator() -> None:
    gen = torch.Generator().manual_seed(0)
    slots = uniform_slots(5, 10_000, gen)
    assert slots.shape == (10_000,) and slots.dtype == torch.int64
    assert slots.min().item() == 0 and slots.max().item() == 4
    again = uniform_slots(5, 10_000, torch.Generator().manual_seed(0))
    assert torch.equal(slots, again)
    assert uniform_slots(1, 3, gen).tolist() == [0, 0, 0]


def test_uniform_slots_leave_global_rng_alone() -> None:
    state = torch.get_rng_state()
    uniform_slots(10, 100, torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(("size", "batch_size"), [(10, 3), (10, 10), (10, 11), (1, 1), (0, 4), (16, 4)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_slots_partition(size: int, batch_size: int, shuffle: bool) -> None:
    batches = list(epoch_slots(size, batch_size, shuffle, torch.Generator().manual_seed(0)))
    assert len(batches) == num_batches(size, batch_size)
    assert all(len(b) == batch_size for b in batches[:-1])
    flat = torch.cat(batches).tolist() if batches else []
    assert sorted(flat) == list(range(size))
    if not shuffle:
        assert flat == list(range(size))


def test_epoch_slots_shuffle_draws_a_fresh_permutation_each_time() -> None:
    gen = torch.Generator().manual_seed(0)
    orders = [torch.cat(list(epoch_slots(30, 7, True, gen))).tolist() for _ in range(3)]
    assert len({tuple(o) for o in orders}) == 3
    assert all(o != list(range(30)) for o in orders)
    replay = torch.Generator().manual_seed(0)
    assert torch.cat(list(epoch_slots(30, 7, True, replay))).tolist() == orders[0]


def test_epoch_slots_unshuffled_does_not_consume_randomness() -> None:
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    list(epoch_slots(20, 6, False, gen))
    assert torch.equal(gen.get_state(), state)


@pytest.mark.parametrize("capacity", [1, 3, 6])
def test_held_under_matches_a_slot_by_slot_model(capacity: int) -> None:
    for old_pointer, old_held, pointer, size in itertools.product(
        range(capacity), range(capacity + 1), range(capacity), range(capacity + 1)
    ):
        age = {(old_pointer - 1 - j) % capacity: j for j in range(old_held)}  # 0: the newest row written
        # walk back from the new newest row while each slot holds the next older written row (time order kept)
        expected = 0
        while expected < size and (pointer - 1 - expected) % capacity in age:
            slot = (pointer - 1 - expected) % capacity
            if expected and age[slot] != age[(slot + 1) % capacity] + 1:
                break
            expected += 1
        assert Ring(capacity, old_held, old_pointer).held_under(pointer, size) == expected


@pytest.mark.parametrize(("pointer", "size", "capacity"), [s for s in ring_states(7) if s[1]])
def test_window_spans_cover_the_newest_rows_oldest_first(pointer: int, size: int, capacity: int) -> None:
    """One or two contiguous slot ranges, together exactly the newest min(window, size) rows in age order."""
    for window in range(1, capacity + 3):
        ranges = Ring(capacity, size, pointer).window_spans(window)
        assert 1 <= len(ranges) <= 2 and all(0 <= lo < hi <= capacity for lo, hi in ranges)
        slots = [s for lo, hi in ranges for s in range(lo, hi)]
        assert slots == reference_chronological(pointer, size, capacity)[-window:]


@pytest.mark.parametrize(("pointer", "size", "capacity"), [s for s in ring_states(6) if s[1]])
def test_recent_slots_draw_only_the_newest_rows(pointer: int, size: int, capacity: int) -> None:
    ring = Ring(capacity, size, pointer)
    for window in range(1, capacity + 2):
        drawn = set(recent_slots(ring, window, 400, torch.Generator().manual_seed(window)).tolist())
        assert drawn == set(reference_chronological(pointer, size, capacity)[-window:])


def test_phantom_rows_are_never_drawn_or_listed() -> None:
    ring = Ring(8, size=8, pointer=3, phantom=5)  # the newest 3 rows hold data: slots 0, 1, 2
    assert ring.chronological("cpu").tolist() == [0, 1, 2]
    assert set(recent_slots(ring, 100, 300, torch.Generator().manual_seed(0)).tolist()) == {0, 1, 2}
    assert ring.window_spans() == ((0, 3),)


@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_batches_cover_every_position_with_spans_in_order(shuffle: bool) -> None:
    batches = list(epoch_batches(10, 4, shuffle, torch.Generator().manual_seed(0)))
    assert sorted(torch.cat([p for p, _ in batches]).tolist()) == list(range(10))
    for positions, span in batches:
        assert (span is None) == shuffle
        if span is not None:
            assert positions.tolist() == list(range(*span))


def test_epochs_read_lazily_and_go_stale() -> None:
    live = [True]
    reads: list[list[int]] = []
    it = epochs(lambda p, s: reads.append(p.tolist()) or p, 5, 2, 2, False, torch.Generator(), lambda: live[0])
    assert next(it).tolist() == [0, 1] and reads == [[0, 1]]  # read when yielded, not before
    assert [b.tolist() for b in [next(it), next(it)]] == [[2, 3], [4]]
    live[0] = False
    with pytest.raises(StaleIteratorError):
        next(it)
