"""One writer thread and sampler threads: a sample never holds a half-written row.

Rows are self-checking: every column of row ``i`` is derived from ``i`` alone, so a row mixing two
writes shows at once. The switch interval is forced down to 1 µs so that the threads interleave
inside single adds and reads (before the seqlock, thousands of rows came back torn in these runs).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import ConcurrentUseError, SchemaError

KEYS = 6
WIDTH = 32


def row(i: int) -> dict[str, np.ndarray]:
    return {f"k{j}": np.full(WIDTH, i * (j + 1), dtype=np.int64) for j in range(KEYS)}


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)[:, None]
    return {f"k{j}": np.repeat(ids * (j + 1), WIDTH, axis=1) for j in range(KEYS)}


def torn(batch: TensorDict) -> int:
    """Rows of ``batch`` whose columns do not all come from one write."""
    ids = batch["k0"][..., :1]
    bad = torch.zeros(batch.batch_size, dtype=torch.bool)
    for j in range(KEYS):
        column = batch.get(f"k{j}", None)
        if column is not None:
            bad |= (column != ids * (j + 1)).any(-1)
    return int(bad.sum())


@pytest.fixture
def fast_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


READS: dict[str, Callable[[ReplayBuffer], Any]] = {
    "sample_batch": lambda rb: [rb.sample_batch(64)],
    "sample_by_index": lambda rb: [rb.sample_by_index(list(range(rb.buffer_size)) * 2)],
    "sample_by_index_fields": lambda rb: [rb.sample_by_index_fields(range(rb.buffer_size), ["k0", "k3", "k5"])],
    "sample_all": lambda rb: [rb.sample_all()],
    "recent": lambda rb: [rb.sample_batch(32, recent=8)],
    "epoch": lambda rb: list(rb.create_epoch_iterator(8, shuffle=False)),
}


@pytest.mark.parametrize("read", READS, ids=str)
@pytest.mark.parametrize("writes", ["add", "add_batch"])
def test_a_sampler_thread_never_sees_a_half_written_row(
    fast_switching: None, tmp_path: Any, read: str, writes: str
) -> None:
    rb = ReplayBuffer("cpu", "cpu", 16, seed=0, storage_dir=tmp_path)
    rb.add_batch(rows(0, 16))
    done = threading.Event()
    failure: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(16, 2500):
                if writes == "add":
                    rb.add(row(i))
                else:
                    rb.add_batch(rows(i * 3, 3))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    bad = reads = 0
    try:
        while not done.is_set() and reads < 400:
            for batch in READS[read](rb):
                bad += torn(batch)
            reads += 1
    finally:
        thread.join()
    assert not failure, failure
    assert reads > 0
    assert bad == 0, f"{bad} torn rows in {reads} reads"


def test_n_step_targets_come_from_whole_rows(fast_switching: None, tmp_path: Any) -> None:
    """reward = i, next_state = [i + 1] * 4, no episode ends: a sum of whole rows is a run of
    consecutive ids, so ``reward == n * id + n * (n - 1) / 2`` with gamma 1, ``next_state == id + steps``."""
    rb = ReplayBuffer("cpu", "cpu", 16, seed=0, storage_dir=tmp_path)

    def step(i: int) -> dict[str, Any]:
        return {"k0": np.full(4, i), "reward": float(i), "next_state": np.full(4, float(i + 1)),
                "terminated": False, "truncated": False}  # fmt: skip

    for i in range(16):
        rb.add(step(i))
    done = threading.Event()

    def writer() -> None:
        try:
            for i in range(16, 2500):
                rb.add(step(i))
        finally:
            done.set()

    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    reads = 0
    try:
        while not done.is_set() and reads < 300:
            batch = rb.sample_batch(32, n_step=3, gamma=1.0)
            ids = batch["k0"][:, 0].double()
            last = batch["next_state"][:, 0].double() - 1  # id of the row the sum stopped at
            n = last - ids + 1
            assert bool(((n >= 1) & (n <= 3)).all()), (ids, last)
            assert torch.equal(batch["reward"].double(), n * ids + n * (n - 1) / 2), (ids, last, batch["reward"])
            reads += 1
    finally:
        thread.join()
    assert reads > 0


def test_a_write_stuck_on_the_rows_read_raises_concurrent_use_error(tmp_path: Any) -> None:
    """A write under way (begun, not done) at the slot read: re-read with backoff, then a clear error."""
    rb = ReplayBuffer("cpu", "cpu", 16, seed=0, storage_dir=tmp_path)
    rb.add_batch(rows(0, 16))
    ring = rb.engine.ring
    ring.begun = ring.done + 1  # as a writer thread does before writing the row at the pointer
    pointer = rb.pointer
    assert torn(rb.sample_by_index([(pointer + 1) % 16, (pointer + 5) % 16])) == 0  # other rows: no wait
    started = time.monotonic()
    with pytest.raises(ConcurrentUseError, match=r"MainThread.*add\(\)/add_batch\(\).*lock") as info:
        rb.sample_by_index([pointer])
    assert isinstance(info.value, RuntimeError)
    assert time.monotonic() - started < 30  # bounded (about half a second of backoff)
    ring.begun = ring.done  # the write finished
    assert torn(rb.sample_by_index([pointer])) == 0


def test_a_rejected_write_ends_its_write_mark(tmp_path: Any) -> None:
    """A refused add/add_batch must not leave rows marked as being written (reads would wait on them)."""
    rb = ReplayBuffer("cpu", "cpu", 16, seed=0, storage_dir=tmp_path)
    rb.add_batch(rows(0, 16))
    ring = rb.engine.ring
    for call in (lambda: rb.add({"k0": 1}), lambda: rb.add_batch({"k0": np.zeros((2, 3))}), lambda: rb.add(5)):
        with pytest.raises((SchemaError, ValueError)):
            call()
        assert ring.begun == ring.done
    rb.add(row(99))
    rb.add_batch(rows(100, 20))
    assert ring.begun == ring.done
    assert torn(rb.sample_all()) == 0
