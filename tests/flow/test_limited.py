"""limited(buffer, limiter): writes and samples admitted as a whole, failures and timeouts that change
nothing (rows, counters, generator), evictions counted as deletes, counters kept by full checkpoints."""

from __future__ import annotations

import copy
import pickle
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import (
    CheckpointError,
    InvalidArgumentError,
    RateLimitDeadlock,
    RateLimitTimeout,
    SchemaError,
)
from objectrl_buffer.flow import LimitedBuffer, MinSize, Queue, RateLimiter, SampleToInsertRatio, limited
from objectrl_buffer.flow.limited import batch_rows
from tests.support import assert_unchanged, edit_manifest, one_row, rows, snapshot

Factory = Callable[..., ReplayBuffer]


def counters(limiter: RateLimiter) -> tuple[int, int, int]:
    return limiter.inserts, limiter.samples, limiter.deletes


def test_batches_are_admitted_whole(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(100), SampleToInsertRatio(2, 10, 4, deadlock_after_s=None))
    buffer.add_batch(rows(0, 10))  # the fill-up is free
    buffer.add(one_row(10))  # 11 * 2 = 22 <= 24
    before = snapshot(buffer.buffer)
    with pytest.raises(RateLimitTimeout):
        buffer.add_batch(rows(11, 2), timeout=0.01)  # 13 * 2 = 26 > 24: neither row goes in
    assert_unchanged(buffer.buffer, before)
    assert counters(buffer.limiter) == (11, 0, 0)
    batch = buffer.sample_batch(4)
    assert batch.batch_size == torch.Size([4]) and counters(buffer.limiter) == (11, 4, 0)
    buffer.add_batch(rows(11, 2), timeout=0)  # 26 - 4 <= 24
    assert len(buffer) == 13 and counters(buffer.limiter) == (13, 4, 0)


def test_a_sample_refused_by_the_limiter_changes_nothing(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(100), MinSize(5, deadlock_after_s=None))
    buffer.add_batch(rows(0, 4))
    before = snapshot(buffer.buffer)
    with pytest.raises(RateLimitTimeout, match="sample of n=8"):
        buffer.sample_batch(8, timeout=0.01)
    assert_unchanged(buffer.buffer, before)  # the generator included: no draw was made
    assert counters(buffer.limiter) == (4, 0, 0)


def test_a_failed_write_or_read_counts_nothing(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(100), Queue(10))
    buffer.add_batch(rows(0, 3))
    with pytest.raises(SchemaError):
        buffer.add_batch({"state": torch.zeros(2, 9)})
    with pytest.raises(InvalidArgumentError):
        buffer.sample_batch(1, n_step=0)
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        buffer.sample_batch(0)
    assert counters(buffer.limiter) == (3, 0, 0) and len(buffer) == 3


def test_a_lone_learner_is_told_instead_of_hanging(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(100), SampleToInsertRatio(1, 10, 2, deadlock_after_s=0))
    before = snapshot(buffer.buffer)
    with pytest.raises(RateLimitDeadlock, match="no other live writer"):
        buffer.sample_batch(1)
    assert_unchanged(buffer.buffer, before)


def test_evicted_rows_count_as_deletes(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(10), MinSize(1))
    buffer.add_batch(rows(0, 8))
    buffer.add_batch(rows(8, 5))
    for i in range(13, 16):
        buffer.add(one_row(i))
    assert counters(buffer.limiter) == (16, 0, 6) and buffer.limiter.size == len(buffer) == 10


def test_vector_env_rows_are_counted_per_env(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(12, num_envs=3), MinSize(1))
    buffer.add({k: v[:3] for k, v in rows(0, 3).items()})
    buffer.add_batch({k: v.reshape(2, 3, *v.shape[1:]) for k, v in rows(3, 6).items()})
    assert counters(buffer.limiter) == (9, 0, 0) and len(buffer) == 9


def test_batch_rows() -> None:
    assert batch_rows(rows(0, 7)) == 7
    assert batch_rows({"a": [1, 2, 3]}) == 3
    assert batch_rows({"a": 1.0}) == 0 and batch_rows({}) == 0 and batch_rows(None) == 0
    assert batch_rows({"a": torch.zeros(4, 2)}, num_envs=2) == 8


def test_wrapper_passes_the_rest_through(make_buffer: Factory, tmp_path: Any) -> None:
    per = PrioritizedReplayBuffer("cpu", "cpu", 50, seed=0, storage_dir=tmp_path / "s")
    buffer = limited(per, SampleToInsertRatio(1, 5, 10))
    buffer.add_batch(rows(0, 15))  # diff 15 = max_diff
    batch = buffer.sample_batch(8)
    buffer.update_priority(batch["index"], torch.full((8,), 3.0))  # the buffer's own method
    assert float(per.max_priority) == 3.0 and buffer.data_size == 15
    buffer.reset()
    assert len(per) == 0 and counters(buffer.limiter) == (0, 0, 0)
    with pytest.raises(InvalidArgumentError, match="already has a rate limiter"):
        LimitedBuffer(per, MinSize(1))
    with pytest.raises(InvalidArgumentError, match="must be a RateLimiter"):
        limited(make_buffer(5), object())  # type: ignore[arg-type]
    per.close()


def test_counters_survive_save_and_load(make_buffer: Factory, tmp_path: Any) -> None:
    buffer = limited(make_buffer(64), SampleToInsertRatio(4, 16, 12))
    buffer.add_batch(rows(0, 16))
    buffer.sample_batch(12)  # diff 64 - 12 = 52 = min_diff
    buffer.add_batch(rows(16, 2))  # diff 60
    path = str(tmp_path / "ckpt")
    buffer.save(path, data=True)
    resumed = limited(make_buffer(64), SampleToInsertRatio(4, 16, 12))
    resumed.load(path)
    assert counters(resumed.limiter) == (18, 12, 0) == counters(buffer.limiter)
    assert len(resumed) == 18
    # no burst after the restore: the learner may take only what the ratio left it
    assert resumed.limiter.try_sample(8) is True  # 60 - 8 = min_diff
    assert resumed.limiter.try_sample(1) is False


def test_a_checkpoint_without_counters_starts_at_the_ratio_centre(make_buffer: Factory, tmp_path: Any) -> None:
    plain = make_buffer(64)
    plain.add_batch(rows(0, 40))
    plain.save(str(tmp_path / "plain"), data=True)
    buffer = limited(make_buffer(64), SampleToInsertRatio(2, 16, 10))
    buffer.load(str(tmp_path / "plain"))
    assert counters(buffer.limiter) == (40, 48, 0)
    assert buffer.limiter.diff == 16 * 2  # the centre of [22, 42]


def test_damaged_counters_are_refused_and_change_nothing(make_buffer: Factory, tmp_path: Any) -> None:
    source = limited(make_buffer(64), MinSize(1))
    source.add_batch(rows(0, 8))
    path = str(tmp_path / "ckpt")
    source.save(path, data=True)
    edit_manifest(path, lambda m: m["extras"]["values"].update({"rate_limiter.deletes": 9}))
    target = limited(make_buffer(64), MinSize(1))
    target.add_batch(rows(100, 3))
    before = snapshot(target.buffer)
    with pytest.raises(CheckpointError, match="deletes 9 > inserts 8"):
        target.load(path)
    assert_unchanged(target.buffer, before)
    assert counters(target.limiter) == (3, 0, 0)
    edit_manifest(path, lambda m: m["extras"]["values"].update({"rate_limiter.deletes": -1}))
    with pytest.raises(CheckpointError, match="rate_limiter"):
        target.load(path)


def test_copies_of_a_limited_buffer_are_independent(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(16), MinSize(1))
    buffer.add_batch(rows(0, 4))
    for clone in (copy.deepcopy(buffer), pickle.loads(pickle.dumps(buffer))):
        clone.add_batch(rows(4, 2))
        assert counters(clone.limiter) == (6, 0, 0) and len(clone) == 6
        assert clone.limiter in clone.buffer.checkpoint_extras
        clone.buffer.close()
    assert counters(buffer.limiter) == (4, 0, 0) and len(buffer) == 4


def test_an_actor_thread_and_a_learner_share_a_limited_buffer(make_buffer: Factory) -> None:
    buffer = limited(make_buffer(1000), SampleToInsertRatio(8, 50, 40))
    buffer.limiter.register()

    def actor() -> None:
        for start in range(0, 600, 6):
            buffer.add_batch(rows(start, 6), timeout=10)

    thread = threading.Thread(target=actor)
    thread.start()
    drawn = 0
    while thread.is_alive() or buffer.limiter.can_sample(16):
        try:
            batch = buffer.sample_batch(16, timeout=0.05)
        except RateLimitTimeout:
            continue
        assert bool((batch["step"] < 600 * 1000).all())
        drawn += 16
    thread.join()
    assert len(buffer) == 600 and buffer.limiter.samples == drawn
    assert buffer.limiter.min_diff <= buffer.limiter.diff <= buffer.limiter.max_diff
