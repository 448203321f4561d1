"""A PrioritizedReplayBuffer handed to child processes shares its rows *and* its priorities: every process adds
(new rows get the shared max priority), updates priorities and samples by them."""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import pickle
import signal
import time
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer
from objectrl_buffer.core.keys import GENERATION_KEY
from objectrl_buffer.distributed.process import become_shared, is_shared
from objectrl_buffer.errors import InvalidArgumentError, SlotIndexError
from tests.distributed.test_process import hang_mid_add, one, write
from tests.distributed.test_shared import assert_consistent, tagged


def per(capacity: int, rows: int = 1, **kwargs: Any) -> PrioritizedReplayBuffer:
    rb = PrioritizedReplayBuffer("cpu", "cpu", capacity, seed=0, backend="torch", **kwargs)
    for seq in range(rows):
        rb.add(one(99, seq))
    return rb


def expected_weights(rb: PrioritizedReplayBuffer, slots: torch.Tensor) -> torch.Tensor:
    """The single-process buffer's weights, from its stated formula: (P(i) / min_batch P) ** -beta."""
    p = (rb.priorities()[slots] + rb.eps) ** rb.alpha
    return ((p / p.min()) ** -rb.beta).to(torch.float32)


def chi_square(rb: PrioritizedReplayBuffer, priority: torch.Tensor, draws: int) -> float:
    """Pearson's statistic of ``draws`` sampled slots against ``(p + eps) ** alpha`` (by hand: no scipy)."""
    counts = torch.zeros(priority.numel(), dtype=torch.float64)
    for _ in range(draws // 1000):
        batch = rb.sample_batch(1000)
        counts += torch.bincount(batch["index"], minlength=priority.numel()).to(torch.float64)
        assert torch.allclose(batch["weight"], expected_weights(rb, batch["index"]))
    weight = (priority + rb.eps) ** rb.alpha
    expected = draws * weight / weight.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_spawn_writers_add_while_the_parent_samples_and_updates_priorities() -> None:
    writers, per_writer = 2, 300
    rb = per(1 + writers * per_writer)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=write, args=(rb, w, per_writer)) for w in range(writers)]
    for p in procs:
        p.start()
    assert is_shared(rb)
    updates = 0
    while any(p.is_alive() for p in procs):
        batch = rb.sample_batch(32)
        assert_consistent(batch)
        assert float(batch["weight"].max()) == 1.0
        rb.update_priority(batch["index"], torch.rand(32, generator=torch.Generator().manual_seed(updates)) + 0.5)
        updates += 1
        time.sleep(0.005)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    n = 1 + writers * per_writer
    assert len(rb) == rb.data_size == rb.total_adds == n and rb.pointer == 0
    rows = rb.sample_all()
    seen = set(zip(rows["writer"].tolist(), rows["seq"].tolist(), strict=True))
    assert seen == {(w, s) for w in range(writers) for s in range(per_writer)} | {(99, 0)}
    # every row has a priority: the max at its commit, or an update's (updates ran, so max >= 1)
    assert updates > 0 and bool((rb.priorities() > 0).all()) and rb.max_priority >= 1.0
    # fixed priorities set by the parent: the draws follow them (chi-square, 600 bins: mean 599, sd ~35)
    priority = torch.arange(n, dtype=torch.float64) % 7 + 1
    rb.update_priority(torch.arange(n), priority)
    assert torch.equal(rb.priorities(), priority)
    assert chi_square(rb, priority, 60_000) < 800
    rb.close()


def test_fixed_priorities_are_drawn_in_proportion() -> None:
    rb = per(20, rows=20)
    become_shared(rb)
    priority = torch.arange(1, 21, dtype=torch.float64)
    rb.update_priority(list(range(20)), priority)
    assert chi_square(rb, priority, 20_000) < 60  # df 19: p ~ 1e-5
    rb.close()


def test_sharing_keeps_the_priorities_and_the_weights_of_the_single_process_buffer() -> None:
    rb = per(8, rows=12)  # a full ring: the rows and their priorities keep their slots
    rb.update_priority([0, 3, 5], [4.0, 0.5, 9.0])
    before, top = rb.priorities(), rb.max_priority
    reference = copy.deepcopy(rb)
    become_shared(rb)
    assert torch.equal(rb.priorities(), before) and rb.max_priority == top == 9.0
    batch = rb.sample_batch(64)
    assert torch.allclose(batch["weight"], reference.importance_weights(batch["index"]))
    assert torch.equal(batch["seq"], reference.sample_by_index(batch["index"])["seq"])
    rb.add(one(5, 5))  # a new row gets the max priority
    assert float(rb.priorities()[rb.pointer - 1]) == 9.0


def update_in_child(rb: PrioritizedReplayBuffer, queue: Any) -> None:
    queue.put(rb.priorities().tolist())  # plain numbers: a tensor would travel as shared memory
    rb.update_priority([1], [50.0])
    rb.add(one(1, 1))
    queue.put(rb.sample_batch(4)["weight"].max().item())


def test_a_fork_child_of_a_shared_buffer_sees_and_changes_the_same_priorities() -> None:
    rb = per(10, rows=4)
    become_shared(rb)
    rb.update_priority([0, 2], [3.0, 7.0])
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=update_in_child, args=(rb, queue))
    proc.start()
    seen = queue.get()
    assert queue.get() == 1.0
    proc.join()
    assert proc.exitcode == 0
    assert seen == [3.0, 1.0, 7.0, 1.0]
    assert rb.priorities().tolist() == [3.0, 50.0, 7.0, 1.0, 50.0]  # the child's update and its new row
    assert rb.max_priority == 50.0
    rb.close()


def test_pickle_and_deepcopy_of_a_shared_buffer_are_independent_plain_copies() -> None:
    rb = per(10, rows=5)
    become_shared(rb)
    rb.update_priority([1, 4], [6.0, 2.0])
    for c in (pickle.loads(pickle.dumps(rb)), copy.deepcopy(rb)):
        assert type(c) is PrioritizedReplayBuffer and not is_shared(c)
        assert torch.equal(c.priorities(), rb.priorities()) and c.max_priority == 6.0
        c.update_priority([0], [100.0])
        c.add(one(7, 7))
        assert len(c) == 6 and float(c.priorities()[5]) == 100.0
    assert len(rb) == 5 and rb.max_priority == 6.0 and float(rb.priorities()[0]) == 1.0
    rb.close()


def test_a_shared_buffer_checks_updates_and_keeps_alpha(tmp_path: Any) -> None:
    rb = per(10, rows=3)
    become_shared(rb)
    before = rb.priorities()
    with pytest.raises(SlotIndexError):
        rb.update_priority([3], [1.0])
    with pytest.raises(InvalidArgumentError, match="finite"):
        rb.update_priority([0, 1], [1.0, float("nan")])
    with pytest.raises(InvalidArgumentError, match="alpha"):
        rb.alpha = 0.1
    assert torch.equal(rb.priorities(), before) and rb.alpha == 0.6
    rb.update_priority([2, 2], [5.0, 0.25])  # a slot given twice takes the last value
    assert float(rb.priorities()[2]) == 0.25 and rb.max_priority == 1.0
    recent = rb.sample_batch(64, recent=2)  # over a snapshot, with the shared priorities
    assert set(recent["index"].tolist()) <= {1, 2} and recent["weight"].shape == (64,)
    assert torch.allclose(recent["weight"], expected_weights(rb, recent["index"]))
    rb.save(tmp_path / "ckpt", data=True)  # a snapshot of the rows and their shared priorities
    loaded = PrioritizedReplayBuffer.from_checkpoint(tmp_path / "ckpt", backend="torch")
    assert torch.equal(loaded.priorities(), rb.priorities()) and loaded.max_priority == rb.max_priority
    rb.close()


def test_a_slot_being_written_is_never_served_even_at_the_top_priority() -> None:
    rb = per(10, rows=5)
    become_shared(rb)
    rb.update_priority([0], [1_000.0])  # nearly all the mass
    rb.shared.slots.begin(torch.tensor([0]))  # a writer rewriting slot 0 (or killed while at it)
    batch = rb.sample_batch(256)
    assert 0 not in batch["index"].tolist() and float(batch["weight"].max()) == 1.0
    assert float(rb.priorities()[0]) == 1_000.0  # its weight is off until rewritten, its raw priority kept
    rb.shared.slots.commit(torch.tensor([0]), torch.tensor([0]))
    rb.update_priority([0], [1_000.0])  # as a writer's priority after its commit
    assert 0 in rb.sample_batch(256)["index"].tolist()
    rb.close()


def hold_priority_lock(rb: PrioritizedReplayBuffer, flag: str) -> None:
    with rb.shared.priority_lock:
        open(flag, "w").close()
        time.sleep(60)


def test_a_writer_killed_mid_write_or_holding_the_priority_lock_blocks_nobody(tmp_path: Any) -> None:
    rb = per(5, rows=5)  # a full ring: the next write rewrites slot 0, which holds the heaviest row
    become_shared(rb)
    rb.update_priority([0], [1_000.0])
    ctx = mp.get_context("fork")
    for i, target in enumerate((hang_mid_add, hold_priority_lock)):
        flag = str(tmp_path / f"flag{i}")
        proc = ctx.Process(target=target, args=(rb, flag))
        proc.start()
        while not os.path.exists(flag):
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        batch = rb.sample_batch(256)  # the half-written slot 0 is never served; the lock is free again
        assert_consistent(batch)
        assert 0 not in batch["index"].tolist()
    rb.add(one(1, 1))  # slot 1 now: the max priority
    rb.update_priority([2], [3.0])
    assert rb.priorities().tolist() == [1_000.0, 1_000.0, 3.0, 1.0, 1.0] and rb.total_adds == 7
    rb.close()


# ---------------------------------------------------------------------- stale priority updates
def test_a_sample_carries_commit_generations_and_an_update_skips_rewritten_slots() -> None:
    rb = per(4, rows=4)  # full: the next add rewrites slot 0
    become_shared(rb)
    batch = rb.sample_batch(64)
    assert torch.equal(batch[GENERATION_KEY], batch["index"] + 1)  # row seq s at slot s: generation s + 1
    rb.add(one(1, 1))  # slot 0 now holds a new row (seq 4): updates drawn before it are stale there
    applied = rb.update_priority(batch["index"], torch.full((64,), 3.0), batch[GENERATION_KEY])
    stale = int((batch["index"] == 0).sum())
    assert stale > 0 and applied == 64 - stale
    assert rb.priorities().tolist() == [1.0, 3.0, 3.0, 3.0]  # the new row keeps the max priority it got
    fresh = rb.sample_batch(256)
    assert fresh[GENERATION_KEY][fresh["index"] == 0].eq(5).all()
    rb.close()


def test_a_mixed_update_applies_the_current_rows_and_the_last_value_of_each() -> None:
    rb = per(4, rows=6)  # slots 0, 1 rewritten once: generations [5, 6, 3, 4]
    become_shared(rb)
    applied = rb.update_priority([0, 0, 1, 1, 2, 3], [2.0, 3.0, 4.0, 9.0, 5.0, 6.0], [5, 1, 6, 2, 3, 4])
    assert applied == 4 and rb.priorities().tolist() == [2.0, 4.0, 5.0, 6.0] and rb.max_priority == 6.0
    assert rb.update_priority([1, 1], [7.0, 8.0], torch.tensor([6, 6])) == 2
    assert rb.priorities().tolist() == [2.0, 8.0, 5.0, 6.0]  # a slot given twice takes the last value
    assert rb.update_priority([2, 3], [0.5, 0.5]) == 2  # no generation: every row applied, as before
    assert rb.priorities().tolist() == [2.0, 8.0, 0.5, 0.5]
    assert rb.update_priority([], [], []) == 0
    before = rb.priorities()
    for generation, message in (([1], "generation has 1"), ([1.5, 2.0], "integers"), ("x", "generation")):
        with pytest.raises(InvalidArgumentError, match=message):
            rb.update_priority([2, 3], [9.0, 9.0], generation)
    with pytest.raises(InvalidArgumentError, match="finite"):  # checked even for a stale row
        rb.update_priority([2, 3], [9.0, float("nan")], [1, 1])
    assert torch.equal(rb.priorities(), before)
    rb.close()


def update_drawn_rows(rb: PrioritizedReplayBuffer, queue: Any, go: Any) -> None:
    """A child draws rows, waits while the parent rewrites some of their slots, then updates them all."""
    batch = rb.sample_batch(64)
    queue.put((batch["index"].tolist(), batch[GENERATION_KEY].tolist()))
    go.wait(60)
    queue.put(rb.update_priority(batch["index"], torch.full((64,), 4.0), batch[GENERATION_KEY]))


def test_a_child_updates_priorities_and_its_stale_rows_are_skipped() -> None:
    rb = per(6, rows=6)
    become_shared(rb)
    ctx = mp.get_context("fork")
    queue, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=update_drawn_rows, args=(rb, queue, go))
    proc.start()
    index, generation = queue.get(timeout=60)
    assert generation == [i + 1 for i in index]
    rb.add_batch(tagged(2, torch.arange(2)))  # the parent rewrites slots 0 and 1 meanwhile
    go.set()
    applied = queue.get(timeout=60)
    proc.join()
    assert proc.exitcode == 0
    assert applied == sum(i >= 2 for i in index)
    assert rb.priorities().tolist() == [1.0, 1.0] + [4.0 if i in index else 1.0 for i in range(2, 6)]
    rb.close()
