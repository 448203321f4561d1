"""samplers: index arithmetic over ring state, checked against plain Python models."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from objectrl_buffer.sampling.uniform import (
    chronological_slots,
    epoch_slots,
    num_batches,
    rows_still_held,
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
    slots = chronological_slots(pointer, size, capacity, torch.device("cpu"))
    assert slots.dtype == torch.int64 and slots.device.type == "cpu"
    assert slots.tolist() == reference_chronological(pointer, size, capacity)


def test_chronological_slots_examples() -> None:
    cpu = torch.device("cpu")
    assert chronological_slots(5, 10, 10, cpu).tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert chronological_slots(0, 10, 10, cpu).tolist() == list(range(10))
    assert chronological_slots(3, 3, 10, cpu).tolist() == [0, 1, 2]
    assert chronological_slots(0, 0, 4, cpu).tolist() == []


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
def test_rows_still_held_matches_a_slot_by_slot_model(capacity: int) -> None:
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
        assert rows_still_held(old_pointer, old_held, pointer, size, capacity) == expected
