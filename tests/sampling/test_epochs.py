"""Epoch iterators, get_steps_and_iterator / get_next_batch, stale iterators, seeds and RNG isolation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import StaleIteratorError
from tests.support import assert_td_equal, fill, objectrl_batch, steps_of

Factory = Callable[..., ReplayBuffer]


def epoch_slots(batches: list[TensorDict]) -> list[int]:
    return torch.cat([b["index"] for b in batches]).tolist()


@pytest.mark.parametrize(("n_rows", "batch_size"), [(10, 3), (10, 5), (10, 10), (10, 1), (10, 64), (7, 2), (1, 4)])
def test_one_epoch_covers_every_row_once_in_slot_order(make_buffer: Factory, n_rows: int, batch_size: int) -> None:
    rb = make_buffer(10)
    fill(rb, range(n_rows + 3 if n_rows == 10 else n_rows))  # wrap the full buffers
    iterator = rb.create_epoch_iterator(batch_size)
    assert rb.epoch_iterator is iterator
    batches = list(iterator)
    assert len(batches) == math.ceil(n_rows / batch_size) == rb.calculate_num_batches(batch_size)
    assert [b.batch_size[0] for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert batches[-1].batch_size[0] == n_rows - batch_size * (len(batches) - 1)
    assert epoch_slots(batches) == list(range(n_rows))  # ObjectRL's order: slot order
    slot_steps = steps_of(rb.sample_by_index(range(n_rows)))
    assert [s for b in batches for s in steps_of(b)] == slot_steps


def test_several_epochs_each_a_partition(wrapped: ReplayBuffer) -> None:
    batches = list(wrapped.create_epoch_iterator(4, n_epochs=3))
    assert len(batches) == 3 * 3
    for epoch in range(3):
        assert epoch_slots(batches[epoch * 3 : epoch * 3 + 3]) == list(range(10))


def test_shuffled_epochs_are_fresh_permutations(make_buffer: Factory) -> None:
    rb = make_buffer(50)
    fill(rb, range(50))
    per_epoch = rb.calculate_num_batches(8)
    batches = list(rb.create_epoch_iterator(8, n_epochs=3, shuffle=True))
    assert len(batches) == 3 * per_epoch
    orders = [epoch_slots(batches[e * per_epoch : (e + 1) * per_epoch]) for e in range(3)]
    for order in orders:
        assert sorted(order) == list(range(50))
        assert order != list(range(50))
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]
    for b in batches:  # rows still match their slots
        assert_td_equal(b, rb.sample_by_index(b["index"]))


def test_buffer_level_shuffle_is_the_default(make_buffer: Factory) -> None:
    rb = make_buffer(40, shuffle=True)
    fill(rb, range(40))
    assert epoch_slots(list(rb.create_epoch_iterator(10))) != list(range(40))
    assert epoch_slots(list(rb.create_epoch_iterator(10, shuffle=False))) == list(range(40))
    rb.get_steps_and_iterator(1, 0, 10)
    order = epoch_slots([rb.get_next_batch(10) for _ in range(4)])
    assert sorted(order) == list(range(40)) and order != list(range(40))
    plain = make_buffer(40)
    fill(plain, range(40))
    assert epoch_slots(list(plain.create_epoch_iterator(10))) == list(range(40))


@pytest.mark.parametrize(("n_rows", "batch_size", "expected"), [(0, 4, 0), (1, 4, 1), (8, 4, 2), (9, 4, 3), (9, 9, 1)])
def test_calculate_num_batches_is_ceil(make_buffer: Factory, n_rows: int, batch_size: int, expected: int) -> None:
    rb = make_buffer(10)
    fill(rb, range(n_rows))
    assert rb.calculate_num_batches(batch_size) == expected


def test_get_steps_and_iterator_with_epochs(wrapped: ReplayBuffer) -> None:
    steps = wrapped.get_steps_and_iterator(n_epochs=2, max_iter=999, batch_size=4)
    assert steps == 2 * 3
    assert wrapped.epoch_iterator is not None
    batches = [wrapped.get_next_batch(4) for _ in range(steps)]
    assert [b.batch_size[0] for b in batches] == [4, 4, 2, 4, 4, 2]
    assert epoch_slots(batches[:3]) == epoch_slots(batches[3:]) == list(range(10))
    with pytest.raises(StopIteration):
        wrapped.get_next_batch(4)


def test_get_steps_and_iterator_without_epochs_samples_randomly(make_buffer: Factory) -> None:
    a, b = make_buffer(10, seed=5), make_buffer(10, seed=5)
    fill(a, range(13))
    fill(b, range(13))
    a.create_epoch_iterator(2)
    assert a.get_steps_and_iterator(n_epochs=-1, max_iter=5, batch_size=6) == 5  # "otherwise", as upstream
    a.create_epoch_iterator(2)
    assert a.get_steps_and_iterator(n_epochs=0, max_iter=17, batch_size=6) == 17
    assert a.epoch_iterator is None
    for _ in range(3):
        out = a.get_next_batch(6)
        assert out.batch_size == (6,)
        assert_td_equal(out, b.sample_batch(6))


def test_get_next_batch_before_any_iterator_samples_randomly(make_buffer: Factory) -> None:
    a, b = make_buffer(10, seed=2), make_buffer(10, seed=2)
    fill(a, range(4))
    fill(b, range(4))
    out = a.get_next_batch(16)  # AttributeError upstream
    assert out.batch_size == (16,)
    assert_td_equal(out, b.sample_batch(16))


@pytest.mark.parametrize("started", [True, False], ids=["started", "not-started"])
def test_iterator_advanced_after_reset_is_stale(wrapped: ReplayBuffer, started: bool) -> None:
    iterator = wrapped.create_epoch_iterator(3)
    if started:
        next(iterator)
    wrapped.reset()
    fill(wrapped, range(100, 104))
    with pytest.raises(StaleIteratorError, match="reset") as info:
        next(iterator)
    assert isinstance(info.value, RuntimeError)
    # a fresh iterator on the new content works
    assert epoch_slots(list(wrapped.create_epoch_iterator(3))) == [0, 1, 2, 3]


def test_get_next_batch_on_a_stale_iterator_raises(wrapped: ReplayBuffer) -> None:
    wrapped.get_steps_and_iterator(1, 0, 4)
    wrapped.get_next_batch(4)
    wrapped.reset(5)
    fill(wrapped, range(5))
    with pytest.raises(StaleIteratorError):
        wrapped.get_next_batch(4)


# ---------------------------------------------------------------- seeds and RNG isolation
def _draws(rb: ReplayBuffer) -> list[torch.Tensor]:
    out = [rb.sample_batch(32)["index"] for _ in range(3)]
    out += [b["index"] for b in rb.create_epoch_iterator(7, n_epochs=2, shuffle=True)]
    rb.get_steps_and_iterator(0, 1, 5)
    out.append(rb.get_next_batch(5)["index"])
    return out


def test_same_seed_and_adds_give_the_same_samples(make_buffer: Factory) -> None:
    a, b = make_buffer(100, seed=123), make_buffer(100, seed=123)
    for rb in (a, b):
        fill(rb, range(30))
        rb.add_batch(objectrl_batch(30, 90))
    torch.manual_seed(0)
    draws_a = _draws(a)
    torch.manual_seed(99)  # global RNG state must not matter
    draws_b = _draws(b)
    assert all(torch.equal(x, y) for x, y in zip(draws_a, draws_b, strict=True))


def test_different_seeds_give_different_samples(make_buffer: Factory) -> None:
    a, b = make_buffer(100, seed=1), make_buffer(100, seed=2)
    fill(a, range(100))
    fill(b, range(100))
    assert not torch.equal(a.sample_batch(64)["index"], b.sample_batch(64)["index"])
    perm_a = epoch_slots(list(a.create_epoch_iterator(100, shuffle=True)))
    perm_b = epoch_slots(list(b.create_epoch_iterator(100, shuffle=True)))
    assert perm_a != perm_b


def test_unseeded_buffers_differ(make_buffer: Factory) -> None:
    a, b = make_buffer(100, seed=None), make_buffer(100, seed=None)
    fill(a, range(100))
    fill(b, range(100))
    assert not torch.equal(a.sample_batch(64)["index"], b.sample_batch(64)["index"])


def test_global_torch_rng_is_never_touched(make_buffer: Factory) -> None:
    state = torch.get_rng_state()
    rb = make_buffer(50, seed=None)
    rb2 = make_buffer(50, seed=7, shuffle=True)
    for buffer in (rb, rb2):
        fill(buffer, range(60))
        buffer.add_batch(objectrl_batch(60, 10))
        buffer.sample_batch(16)
        buffer.sample_random(16)
        list(buffer.create_epoch_iterator(8, n_epochs=2))
        buffer.get_steps_and_iterator(0, 3, 8)
        buffer.get_next_batch(8)
        buffer.sample_all()
        buffer.reset(20)
    assert torch.equal(torch.get_rng_state(), state)


def test_close_makes_epoch_iterators_stale_and_drops_the_iterator() -> None:
    from objectrl_buffer.errors import StaleIteratorError

    rb = ReplayBuffer("cpu", "cpu", 8, seed=0)
    rb.add_batch({"x": torch.arange(6.0)})
    iterator = rb.create_epoch_iterator(2)
    next(iterator)
    rb.close()
    assert rb.epoch_iterator is None
    with pytest.raises(StaleIteratorError):
        next(iterator)


def test_metadata_only_load_makes_epoch_iterators_stale(tmp_path) -> None:
    from objectrl_buffer.errors import StaleIteratorError

    rb = ReplayBuffer("cpu", "cpu", 8, seed=0)
    rb.add_batch({"x": torch.arange(6.0)})
    rb.save(tmp_path / "small")
    rb.add_batch({"x": torch.arange(2.0)})
    iterator = rb.create_epoch_iterator(2)
    rb.load(tmp_path / "small")
    assert len(rb) == 6 and rb.epoch_iterator is None
    with pytest.raises(StaleIteratorError):
        next(iterator)
    rb.close()
