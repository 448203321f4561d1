"""Recency window: sample_batch(recent=m), epoch iterators and get_steps_and_iterator over the newest rows."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError

logging.getLogger("torchrl").setLevel(logging.WARNING)


def make(tmp_path: Any, capacity: int, added: int, seed: int = 0) -> ReplayBuffer:
    """A buffer of ``capacity`` after ``added`` rows; row ``s`` holds ``step == s``."""
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=seed, storage_dir=tmp_path)
    rb.add_batch({"step": torch.arange(added), "x": torch.randn(added, 3)})
    return rb


def newest(added: int, capacity: int, m: int) -> list[int]:
    """Steps of the newest ``min(m, stored)`` rows, oldest first (the reference)."""
    stored = list(range(max(0, added - capacity), added))
    return stored[-m:]


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 30), added=st.integers(1, 80), m=st.integers(1, 40), seed=st.integers(0, 1000))
def test_sample_batch_draws_only_from_the_newest_rows(
    tmp_path_factory: Any, capacity: int, added: int, m: int, seed: int
) -> None:
    rb = make(tmp_path_factory.mktemp("r"), capacity, added, seed)
    window = set(newest(added, capacity, m))
    drawn = rb.sample_batch(60 * len(window), recent=m)
    steps = drawn["step"].tolist()
    assert set(steps) == window  # only the window, and (60 draws per row) all of it
    assert torch.equal(rb.sample_by_index(drawn["index"])["step"], drawn["step"])  # index = slot of the row
    rb.close()


def test_window_is_uniform(tmp_path: Any) -> None:
    """Counts over 1e5 draws from a window of 10 stay within 5 standard deviations of 1e4 each."""
    rb = make(tmp_path, 50, 120)
    counts = torch.bincount(rb.sample_batch(100_000, recent=10)["step"] - 110, minlength=10)
    sd = (100_000 * 0.1 * 0.9) ** 0.5
    assert counts.numel() == 10 and bool(((counts - 10_000).abs() < 5 * sd).all())


def test_recent_one_is_always_the_newest_row(tmp_path: Any) -> None:
    rb = make(tmp_path, 7, 23)
    assert set(rb.sample_batch(50, recent=1)["step"].tolist()) == {22}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    ("capacity", "added", "m", "bs"), [(10, 25, 4, 3), (10, 25, 10, 4), (10, 6, 20, 4), (8, 8, 8, 8)]
)
def test_epochs_cover_the_window_exactly_once(
    tmp_path: Any, capacity: int, added: int, m: int, bs: int, shuffle: bool
) -> None:
    rb = make(tmp_path, capacity, added)
    window = newest(added, capacity, m)
    steps = rb.get_steps_and_iterator(2, 999, bs, shuffle=shuffle, recent=m)
    batches = list(rb.epoch_iterator or [])
    per_epoch = -(-len(window) // bs)
    assert steps == len(batches) == 2 * per_epoch
    for epoch in range(2):
        seen = [s for b in batches[epoch * per_epoch : (epoch + 1) * per_epoch] for s in b["step"].tolist()]
        if shuffle:
            assert sorted(seen) == window
        else:
            assert seen == window  # oldest first within the window


def test_create_epoch_iterator_recent(tmp_path: Any) -> None:
    rb = make(tmp_path, 10, 25)
    steps = [s for b in rb.create_epoch_iterator(4, recent=3) for s in b["step"].tolist()]
    assert steps == [22, 23, 24]


def test_get_next_batch_keeps_the_window_until_the_next_call(tmp_path: Any) -> None:
    rb = make(tmp_path, 10, 25)
    assert rb.get_steps_and_iterator(0, 17, 8, recent=2) == 17
    assert set(rb.get_next_batch(200)["step"].tolist()) == {23, 24}
    rb.add({"step": torch.tensor(25), "x": torch.zeros(3)})
    assert set(rb.get_next_batch(200)["step"].tolist()) == {24, 25}  # the window follows new rows
    rb.get_steps_and_iterator(0, 17, 8)
    assert set(rb.get_next_batch(500)["step"].tolist()) == set(range(16, 26))


def test_without_recent_nothing_changes(tmp_path: Any) -> None:
    """recent=None keeps the uniform draws, bit for bit (same seed, same rows)."""
    a, b = make(tmp_path / "a", 10, 25, seed=3), make(tmp_path / "b", 10, 25, seed=3)
    assert torch.equal(a.sample_batch(64)["index"], b.sample_batch(64, recent=None)["index"])
    assert torch.equal(a.get_next_batch(64)["index"], b.sample_batch(64)["index"])


@pytest.mark.parametrize("recent", [0, -1, 2.5, "3"])
def test_bad_recent_raises_and_changes_nothing(tmp_path: Any, recent: Any) -> None:
    rb = make(tmp_path, 10, 25)
    rb.get_steps_and_iterator(0, 5, 4)
    state = rb.generator.get_state()
    calls = [
        lambda: rb.sample_batch(4, recent=recent),
        lambda: rb.create_epoch_iterator(4, recent=recent),
        lambda: rb.get_steps_and_iterator(1, 5, 4, recent=recent),
        lambda: rb.get_steps_and_iterator(0, 5, 4, recent=recent),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="recent"):
            call()
    assert torch.equal(rb.generator.get_state(), state)
    assert rb.epoch_iterator is None and (len(rb), rb.pointer) == (10, 5)
    assert set(rb.get_next_batch(300)["step"].tolist()) == set(range(15, 25))  # still the whole buffer


def test_recent_on_an_empty_buffer_raises(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path)
    with pytest.raises(EmptyBufferError):
        rb.sample_batch(4, recent=3)
    with pytest.raises(EmptyBufferError):
        rb.create_epoch_iterator(4, recent=3)


def test_prioritized_buffer_draws_from_a_window(tmp_path: Any) -> None:
    """Exact distributions and weights: tests/test_prioritized.py; here the window is the newest rows."""
    rb = PrioritizedReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)
    rb.add_batch({"step": torch.arange(5)})
    assert set(rb.sample_batch(200, recent=2)["step"].tolist()) == {3, 4}
    assert [s for b in rb.create_epoch_iterator(2, recent=2) for s in b["step"].tolist()] == [3, 4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_recent_on_cuda_storage() -> None:
    rb = ReplayBuffer("cuda", "cuda", 10, seed=0)
    rb.add_batch({"step": torch.arange(25, device="cuda")})
    assert set(rb.sample_batch(100, recent=3)["step"].tolist()) == {22, 23, 24}
