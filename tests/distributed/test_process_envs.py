"""A buffer with ``num_envs > 1`` handed to child processes: every process's ``add`` of one ``[E]`` env step
reserves ``E`` consecutive slots, ``add_batch`` of ``[T, E]`` steps ``T * E``, so the rows keep the slot layout
of a single-process buffer (env ``e`` of step ``t`` at slot ``t * E + e``) and every read over a snapshot
(``sample_all``, n-step, slices) gives what a single-process buffer fed the same steps gives."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.core.keys import GENERATION_KEY
from objectrl_buffer.distributed.process import become_shared, is_shared
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from objectrl_buffer.flow import MinSize
from tests.distributed.test_shared import assert_consistent, tagged


def step(writer: int, t: int, envs: int) -> dict[str, torch.Tensor]:
    """Env step ``t`` of ``writer``: env ``e``'s row is tagged ``(writer, t * envs + e)`` (``seq % envs``: its env)."""
    rows = tagged(writer, torch.arange(t * envs, (t + 1) * envs))
    rows["reward"] = rows["seq"].to(torch.float32)
    rows["next_state"] = rows["obs"] + 0.5
    rows["terminated"] = (rows["seq"] // envs % 3 == 2).to(torch.float32)  # an episode end every third step
    rows["truncated"] = torch.zeros(envs)
    return rows


def steps(writer: int, t0: int, count: int, envs: int) -> dict[str, torch.Tensor]:
    """``count`` env steps from ``t0``, ``[count, envs]`` time-major."""
    parts = [step(writer, t, envs) for t in range(t0, t0 + count)]
    return {k: torch.stack([p[k] for p in parts]) if parts else torch.empty(0) for k in step(0, 0, envs)}


def make(cls: type, envs: int, capacity: int) -> Any:
    extra = {"backend": "torch"} if cls is PrioritizedReplayBuffer else {}
    return cls("cpu", "cpu", capacity, seed=0, num_envs=envs, **extra)


def feed(buffers: list[Any], ops: list[int], envs: int, t: int) -> int:
    """Apply ``ops`` to every buffer: 0 an ``add`` of one step, ``T > 0`` an ``add_batch`` of ``T`` steps."""
    for op in ops:
        for rb in buffers:
            if op == 0:
                rb.add(step(0, t, envs))
            else:
                rb.add_batch(steps(0, t, op, envs))
        t += max(op, 1)
    return t


def assert_same_reads(rb: Any, reference: Any) -> None:
    """Every read of the shared buffer equals the single-process buffer's (same seed, same draws)."""
    assert len(rb) == len(reference) and rb.pointer == reference.pointer
    got, want = rb.sample_all(), reference.sample_all()
    assert got.batch_size == want.batch_size and got.batch_size[1] == rb.num_envs
    for key in ("index", "seq", "writer", "obs", "frame"):
        assert torch.equal(got[key], want[key]), key
    assert torch.equal(got["seq"] % rb.num_envs, torch.arange(rb.num_envs).expand_as(got["seq"]))
    got, want = rb.sample_batch(32, n_step=3, gamma=0.5), reference.sample_batch(32, n_step=3, gamma=0.5)
    for key in ("index", "seq", "reward", "next_state", "discount"):
        assert torch.equal(got[key], want[key]), key
    got, want = rb.sample_slices(4, 2, pad=True), reference.sample_slices(4, 2, pad=True)
    assert torch.equal(got["index"], want["index"]) and torch.equal(got["seq"], want["seq"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    envs=st.integers(2, 3),
    steps_held=st.integers(2, 5),
    before=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    after=st.lists(st.integers(0, 6), min_size=1, max_size=8),
    prioritized=st.booleans(),
)
def test_a_shared_buffer_with_envs_reads_as_a_single_process_buffer_fed_the_same_steps(
    envs: int, steps_held: int, before: list[int], after: list[int], prioritized: bool
) -> None:
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    rb, reference = make(cls, envs, envs * steps_held), make(cls, envs, envs * steps_held)
    t = feed([rb, reference], before, envs, 0)
    become_shared(rb)  # the rows keep their slots (the ring may have wrapped)
    assert is_shared(rb) and rb.num_envs == envs
    feed([rb, reference], after, envs, t)
    assert_same_reads(rb, reference)
    if prioritized:
        assert torch.equal(rb.priorities(), reference.priorities())
    rb.close()


def test_prioritized_steps_get_the_max_priority_and_stale_updates_are_skipped() -> None:
    rb, reference = make(PrioritizedReplayBuffer, 2, 6), make(PrioritizedReplayBuffer, 2, 6)
    feed([rb, reference], [3], 2, 0)  # 3 steps: the ring is full
    become_shared(rb)
    batch = rb.sample_batch(64)
    for buffer in (rb, reference):
        buffer.update_priority([0, 1, 4], [5.0, 2.0, 3.0])
        buffer.add(step(0, 3, 2))  # rewrites slots 0 and 1 with the max priority
    assert rb.priorities().tolist() == reference.priorities().tolist() == [5.0, 5.0, 1.0, 1.0, 3.0, 1.0]
    applied = rb.update_priority(batch["index"], torch.full((64,), 0.5), batch[GENERATION_KEY])
    assert applied == int((batch["index"] >= 2).sum())
    drawn = set(batch["index"].tolist())
    kept = [1.0, 1.0, 3.0, 1.0]  # slots 2..5 before the update
    assert rb.priorities().tolist() == [5.0, 5.0] + [0.5 if s in drawn else kept[s - 2] for s in range(2, 6)]
    rb.close()


def test_a_shared_buffer_with_envs_refuses_a_step_of_the_wrong_shape() -> None:
    rb = make(ReplayBuffer, 3, 9)
    rb.add(step(0, 0, 3))
    become_shared(rb)
    for call, error in (
        (lambda: rb.add(tagged(0, torch.arange(2))), SchemaError),  # 2 envs, not 3
        (lambda: rb.add({k: v[0] for k, v in step(0, 1, 3).items()}), SchemaError),  # one row, not a step
        (lambda: rb.add_batch(tagged(0, torch.arange(6))), SchemaError),  # [N] rows, not [T, 3] steps
        (lambda: rb.add("x"), InvalidArgumentError),
    ):
        with pytest.raises(error):
            call()
    assert len(rb) == 3 and rb.total_adds == 3 and rb.pointer == 3  # nothing reserved, nothing stored
    rb.add_batch(steps(0, 1, 2, 3))
    assert rb.sample_all()["seq"].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    rb.close()


def test_a_snapshot_leaves_out_a_step_being_written_whole() -> None:
    rb = make(ReplayBuffer, 2, 8)
    rb.add_batch(steps(0, 0, 3, 2))
    become_shared(rb)
    rb.shared.slots.begin(torch.tensor([3]))  # env 1 of step 1 being written (or its writer killed)
    rows = rb.sample_all()  # steps 0 and 2, each whole: no env's row lands in another env's column
    assert rows["seq"].tolist() == [[0, 1], [4, 5]]
    assert 3 not in rb.sample_batch(256)["index"].tolist()
    rb.shared.slots.commit(torch.tensor([3]), torch.tensor([3]))  # the write finishes
    assert rb.sample_all()["seq"].tolist() == [[0, 1], [2, 3], [4, 5]]
    rb.add(step(0, 3, 2))
    rb.shared.slots.begin(torch.tensor([6]))  # the newest step half written: the snapshot ends before it
    rows = rb.sample_all()
    assert rows["seq"].tolist() == [[0, 1], [2, 3], [4, 5]] and rows["index"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert rb.sample_batch(8, n_step=2)["seq"].max() <= 5
    rb.close()


def test_a_rate_limited_shared_buffer_with_envs_counts_every_env_row() -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0, num_envs=2, rate_limiter=MinSize(1))
    rb.add(step(0, 0, 2))
    become_shared(rb)
    rb.add(step(0, 1, 2), timeout=0.01)
    rb.add_batch(steps(0, 2, 3, 2), timeout=0.01)  # 6 rows: the ring of 8 drops the oldest 2
    limiter = rb.rate_limiter
    assert (limiter.inserts, limiter.deletes, limiter.size) == (10, 2, 8)
    assert rb.sample_all()["seq"].tolist() == [[2, 3], [4, 5], [6, 7], [8, 9]]
    rb.close()


# ---------------------------------------------------------------------- many processes
def write_steps(queue: Any, writer: int, count: int) -> None:
    """A writer process: single env steps, with a batch of 5 steps every 50."""
    rb = queue.get()  # through multiprocessing's pickler: a buffer attached to the shared rows
    assert rb.num_envs == ENVS
    t = 0
    while t < count:
        if t % 50 == 25 and t + 5 <= count:
            rb.add_batch(steps(writer, t, 5, ENVS))
            t += 5
            continue
        rb.add(step(writer, t, ENVS))
        t += 1
    rb.close()


ENVS = 4


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_writers_add_env_steps_while_the_parent_samples(cls: type) -> None:
    writers, count = 3, 400
    rb = make(cls, ENVS, ENVS * (writers * count + 1))
    rb.add(step(99, 0, ENVS))
    become_shared(rb)  # now: Queue.put pickles in a feeder thread, which would share it while we sample
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=write_steps, args=(queue, w, count)) for w in range(writers)]
    for p in procs:
        p.start()
    for _ in procs:
        queue.put(rb)
    while any(p.is_alive() for p in procs):
        batch = rb.sample_batch(64)
        assert_consistent(batch)  # no torn row
        assert torch.equal(batch["index"] % ENVS, batch["seq"] % ENVS)  # every row at its env's slot
        time.sleep(0.002)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    held = ENVS * (writers * count + 1)
    assert len(rb) == rb.total_adds == held and rb.pointer == 0
    rows = rb.sample_all()  # [T, ENVS]: each row of it one whole step of one writer
    assert rows.batch_size == (writers * count + 1, ENVS)
    assert_consistent(rows.reshape(-1))
    assert torch.equal(rows["seq"] % ENVS, torch.arange(ENVS).expand_as(rows["seq"]))
    assert bool((rows["writer"] == rows["writer"][:, :1]).all())
    assert bool((rows["seq"] // ENVS == rows["seq"][:, :1] // ENVS).all())
    seen = set(zip(rows["writer"][:, 0].tolist(), (rows["seq"][:, 0] // ENVS).tolist(), strict=True))
    assert seen == {(w, t) for w in range(writers) for t in range(count)} | {(99, 0)}  # nothing lost or twice
    for w in range(writers):  # each writer's steps in its own order
        mine = rows["seq"][:, 0][rows["writer"][:, 0] == w] // ENVS
        assert mine.tolist() == list(range(count))
    rb.close()
