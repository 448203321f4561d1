"""``rate_limiter=`` on the buffers, and one RateLimiter coordinating several processes."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from typing import Any

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import RateLimitTimeout
from objectrl_buffer.flow import MinSize, SampleToInsertRatio


def row(i: int) -> dict[str, Any]:
    return {"obs": torch.full((3,), float(i)), "step": i}


def test_rate_limiter_argument_gates_adds_and_samples(tmp_path: Any) -> None:
    limiter = SampleToInsertRatio(2, 4, 5)  # min_diff 3, max_diff 13
    rb = ReplayBuffer("cpu", "cpu", 100, seed=0, rate_limiter=limiter)
    with pytest.raises(RateLimitTimeout):
        rb.sample_batch(1, timeout=0.01)  # fewer than min_size_to_sample rows
    for i in range(4):
        rb.add(row(i), timeout=0.01)
    rb.add_batch({"obs": torch.zeros(2, 3), "step": torch.tensor([4, 5])}, timeout=0.01)
    assert (limiter.inserts, len(rb)) == (6, 6)
    with pytest.raises(RateLimitTimeout):
        rb.add(row(6), timeout=0.01)  # diff would be 14 > 13
    assert (limiter.inserts, len(rb)) == (6, 6)  # a timeout changes nothing
    state = rb.generator.get_state()
    with pytest.raises(RateLimitTimeout):
        rb.sample_batch(10, timeout=0.01)  # diff would go below 3
    assert limiter.samples == 0 and torch.equal(rb.generator.get_state(), state)
    rb.sample_batch(9, timeout=0.01)
    assert limiter.samples == 9
    rb.save(tmp_path / "ckpt", data=True)
    back = ReplayBuffer("cpu", "cpu", 100, seed=0, rate_limiter=SampleToInsertRatio(2, 4, 5))
    back.load(tmp_path / "ckpt")
    assert (back.rate_limiter.inserts, back.rate_limiter.samples) == (6, 9)  # no burst after a restore
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.rate_limiter is not limiter and copy.rate_limiter.inserts == 6
    copy.add(row(6), timeout=0.01)
    copy.sample_batch(2, timeout=0.01)
    assert (copy.rate_limiter.samples, limiter.samples) == (11, 9)  # gated, and independent
    plain = ReplayBuffer("cpu", "cpu", 10, seed=0)
    assert "add" in vars(plain) and plain.rate_limiter is None  # the per-step path is untouched


def test_evictions_count_as_deletes() -> None:
    rb = ReplayBuffer("cpu", "cpu", 4, seed=0, rate_limiter=MinSize(1))
    for i in range(6):
        rb.add(row(i))
    assert (rb.rate_limiter.inserts, rb.rate_limiter.deletes, rb.rate_limiter.size) == (6, 2, 4)


def writer(rb: ReplayBuffer, first: int, n: int) -> None:
    for i in range(first, first + n):
        rb.add(row(i), timeout=60)


def sampler(rb: ReplayBuffer, stop: Any, out: Any) -> None:
    worst = 0.0
    limiter = rb.rate_limiter
    while True:
        try:
            rb.sample_batch(8, timeout=0.2)
        except RateLimitTimeout:
            if stop.is_set():
                break
            continue
        worst = max(worst, abs(limiter.diff - 400))
    out.put(worst)


def test_one_limiter_coordinates_writer_and_sampler_processes() -> None:
    """SampleToInsertRatio(4, 100, 400) over 10k inserts from 2 writer processes and a sampler process."""
    ctx = mp.get_context("fork")
    limiter = SampleToInsertRatio(4, 100, 400)  # diff kept in [0, 800]
    rb = ReplayBuffer("cpu", "cpu", 20_000, seed=0, rate_limiter=limiter)
    rb.add(row(-1))
    queue = ctx.SimpleQueue()
    queue.put(rb)  # shared: the rows and the limiter's counters
    queue.get()
    stop, out = ctx.Event(), ctx.SimpleQueue()
    procs = [ctx.Process(target=writer, args=(rb, w * 5000, 5000 - w)) for w in range(2)]
    procs.append(ctx.Process(target=sampler, args=(rb, stop, out)))
    for p in procs:
        p.start()
    diffs = []
    while any(p.is_alive() for p in procs[:2]):
        diffs.append(limiter.diff)
        time.sleep(0.01)
    stop.set()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert limiter.inserts == len(rb) == 10_000
    assert all(-8 <= d <= 800 + 4 for d in diffs)  # inside the error buffer (a read may race a call)
    assert 0 <= limiter.diff <= 800 and out.get() <= 400
    ratio = limiter.samples / (limiter.inserts - 100)
    assert 4 - 800 / 9_900 <= ratio <= 4 + 400 / 9_900
