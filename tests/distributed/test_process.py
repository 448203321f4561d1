"""A plain CPU ReplayBuffer handed to child processes shares its rows (multiprocessing's pickler only).

Every row is self-checking (each field encodes its writer and sequence number), so a torn row, a lost row
or a wrong counter shows."""

from __future__ import annotations

import copy
import io
import multiprocessing as mp
import os
import pickle
import signal
import time
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.distributed.process import is_shared
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError
from tests.distributed.test_shared import SLOW_ONLY, assert_consistent, tagged


def one(writer: int, seq: int) -> dict[str, torch.Tensor]:
    return {k: v[0] for k, v in tagged(writer, torch.tensor([seq])).items()}


def write(buffer: ReplayBuffer, writer: int, n: int) -> None:
    """A writer process: single adds (the per-step path) with a batch of 50 every 500 rows."""
    seq = 0
    while seq < n:
        if seq % 500 == 250 and seq + 50 <= n:
            buffer.add_batch(tagged(writer, torch.arange(seq, seq + 50)))
            seq += 50
            continue
        buffer.add(one(writer, seq))
        seq += 1


def seeded_buffer(capacity: int, rows: int = 1) -> ReplayBuffer:
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0)
    for seq in range(rows):
        rb.add(one(99, seq))
    return rb


def run_writers(ctx: Any, rb: ReplayBuffer, writers: int, per_writer: int) -> int:
    procs = [ctx.Process(target=write, args=(rb, w, per_writer)) for w in range(writers)]
    for p in procs:
        p.start()
    sampled = 0
    while any(p.is_alive() for p in procs):
        assert_consistent(rb.sample_batch(64))  # the parent samples while the children write
        sampled += 1
        time.sleep(0.002)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    return sampled


def assert_all_there(rb: ReplayBuffer, writers: int, per_writer: int, before: int = 1) -> None:
    rows = rb.sample_all()
    assert len(rb) == rb.data_size == rows.batch_size[0] == before + writers * per_writer
    assert rb.total_adds == before + writers * per_writer and rb.pointer == len(rb) % rb.buffer_size
    seen = set(zip(rows["writer"].tolist(), rows["seq"].tolist(), strict=True))
    expected = {(w, s) for w in range(writers) for s in range(per_writer)} | {(99, s) for s in range(before)}
    assert seen == expected  # nothing lost, nothing twice
    assert_consistent(rows)


def share_now(rb: ReplayBuffer) -> None:
    """Through multiprocessing's pickler once (as a Queue would), so that fork children inherit it shared."""
    queue = mp.get_context("fork").SimpleQueue()
    queue.put(rb)
    queue.get().close()


@pytest.mark.parametrize(
    ("method", "writers", "per_writer"),
    # a spawn child imports torch afresh (10-30 s each on a loaded 2-core machine): 1 in CI, 4 x 100k with RUN_SLOW
    [
        ("spawn", 1, 2_000),
        ("fork", 4, 5_000),  # shared at the first fork: the buffer is a Process argument
        ("fork-after-queue", 2, 5_000),  # shared through a Queue first, then inherited shared
        pytest.param("spawn", 4, 100_000, marks=SLOW_ONLY),
    ],
)
def test_writers_share_a_plain_buffer_while_the_parent_samples(method: str, writers: int, per_writer: int) -> None:
    rb = seeded_buffer(writers * per_writer + 1)
    assert not is_shared(rb)
    if method == "fork-after-queue":
        share_now(rb)
        assert is_shared(rb)
    run_writers(mp.get_context(method.removesuffix("-after-queue")), rb, writers, per_writer)
    assert is_shared(rb) and isinstance(rb, ReplayBuffer)
    assert_all_there(rb, writers, per_writer)
    rb.close()


def take_and_write(queue: Any, writer: int, n: int, done: Any) -> None:
    rb = queue.get()
    write(rb, writer, n)
    done.put(len(rb))


def test_fork_children_share_it_through_a_queue_and_inherit_it_once_shared() -> None:
    ctx = mp.get_context("fork")
    rb = seeded_buffer(2_001)
    queue, done = ctx.Queue(), ctx.Queue()
    early = ctx.Process(target=take_and_write, args=(queue, 0, 500, done))  # forked before it was shared
    early.start()
    queue.put(rb)  # multiprocessing's pickler: the parent's buffer moves to shared memory here
    assert done.get(timeout=60) >= 501
    early.join()
    assert is_shared(rb)
    late = ctx.Process(target=write, args=(rb, 1, 500))  # forked after: inherits the shared buffer
    late.start()
    late.join()
    assert late.exitcode == early.exitcode == 0
    assert_all_there(rb, 2, 500)
    rb.add(one(99, 1))
    assert len(rb) == 1002 and rb.sample_all()["seq"][-1] == 1
    rb.close()


def test_torch_multiprocessing_workers_share_it() -> None:
    import torch.multiprocessing as tmp

    rb = seeded_buffer(1001)
    tmp.spawn(write_for_spawn, args=(rb,), nprocs=1)
    assert_all_there(rb, 1, 500)
    rb.close()


def write_for_spawn(rank: int, rb: ReplayBuffer) -> None:
    write(rb, rank, 500)


def test_pickle_deepcopy_and_torch_save_still_copy(tmp_path: Any) -> None:
    rb = seeded_buffer(100, rows=10)
    share_now(rb)
    proc = mp.get_context("fork").Process(target=write, args=(rb, 1, 20))
    proc.start()
    proc.join()
    assert is_shared(rb) and len(rb) == 30
    buf = io.BytesIO()
    torch.save(rb, buf)
    buf.seek(0)
    copies = [pickle.loads(pickle.dumps(rb)), copy.deepcopy(rb), torch.load(buf, weights_only=False)]
    for c in copies:
        assert type(c) is ReplayBuffer and not is_shared(c)
        assert torch.equal(c.sample_all()["seq"], rb.sample_all()["seq"])
        c.add(one(7, 7))
        assert len(c) == 31
    assert len(rb) == 30  # the copies are independent
    rb.add(one(8, 8))
    assert all(len(c) == 31 for c in copies)
    rb.close()


def hang_mid_add(rb: ReplayBuffer, flag: str) -> None:
    """Reserve a slot, write half a row, never finish (the test SIGKILLs it)."""
    seq = rb.shared.slots.reserve(1)
    slot = torch.tensor([seq % rb.buffer_size])
    rb.shared.slots.begin(slot)
    rb.shared.columns["seq"][slot] = -7
    open(flag, "w").close()
    time.sleep(60)


def hold_lock(rb: ReplayBuffer, flag: str) -> None:
    with rb.shared.slots.lock:
        open(flag, "w").close()
        time.sleep(60)


@pytest.mark.parametrize("kills", [4, pytest.param(20, marks=SLOW_ONLY)])
def test_a_writer_killed_mid_write_never_blocks_the_others(kills: int, tmp_path: Any) -> None:
    ctx = mp.get_context("fork")
    rb = seeded_buffer(10_000)
    share_now(rb)
    for i in range(kills):
        flag = str(tmp_path / f"flag{i}")
        proc = ctx.Process(target=hang_mid_add if i % 2 == 0 else hold_lock, args=(rb, flag))
        proc.start()
        while not os.path.exists(flag):
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        write(rb, 1, 100)  # the lock is free again; the half-written slot is skipped
        for _ in range(10):
            batch = rb.sample_batch(256)
            assert_consistent(batch)
            assert bool((batch["seq"] >= 0).all())
    assert rb.total_adds == 1 + 100 * kills + (kills + 1) // 2
    assert rb.sample_all().batch_size[0] == 1 + 100 * kills
    rb.close()


def test_shared_buffer_refuses_what_it_cannot_do(tmp_path: Any) -> None:
    rb = seeded_buffer(100, rows=5)
    queue = mp.get_context("fork").SimpleQueue()
    queue.put(rb)
    with pytest.raises(InvalidArgumentError, match="shared buffer"):
        rb.reset()
    with pytest.raises(SchemaError):
        rb.add({"seq": 1})
    assert len(rb) == 5 and rb.total_adds == 5  # a refused add changes nothing
    rb.save(tmp_path / "ckpt", data=True)  # a snapshot of the shared rows
    loaded = ReplayBuffer.from_checkpoint(tmp_path / "ckpt")
    assert torch.equal(loaded.sample_all()["seq"], rb.sample_all()["seq"])
    per = PrioritizedReplayBuffer("cpu", "cpu", 10, seed=0)
    per.add(one(0, 0))
    queue.put(per)  # shared with its priorities (tests/distributed/test_shared_prioritized.py)
    queue.get().close()
    with pytest.raises(InvalidArgumentError, match="shared buffer"):
        per.load_priority_state(per.priority_state())
    per.close()
    empty = ReplayBuffer("cpu", "cpu", 10, seed=0)
    with pytest.raises(InvalidArgumentError, match="add a row"):
        queue.put(empty)
    rb.close()
    with pytest.raises(EmptyBufferError):
        seeded_buffer(10, rows=0).sample_batch(1)


def test_a_full_ring_keeps_its_slots_when_shared() -> None:
    rb = seeded_buffer(8, rows=13)  # wrapped: pointer 5
    before = rb.sample_all()
    pickle.loads(pickle.dumps(rb))  # a plain pickle does not share
    assert not is_shared(rb)
    queue = mp.get_context("fork").SimpleQueue()
    queue.put(rb)
    assert is_shared(rb) and rb.pointer == 5 and len(rb) == 8
    after = rb.sample_all()
    assert torch.equal(after["index"], before["index"]) and torch.equal(after["seq"], before["seq"])
    assert torch.equal(rb.sample_by_index([5])["seq"], torch.tensor([5]))
    rb.close()


def test_a_snapshot_serves_only_finished_rows_while_rows_are_being_written() -> None:
    rb = seeded_buffer(10, rows=6)
    share_now(rb)
    rb.add(one(1, 6))
    rb.add(one(1, 7))  # rows this process's own storage never held
    rb.shared.slots.begin(torch.tensor([7]))  # the newest row being written (by another process)
    rows = rb.sample_all()
    assert rows["seq"].tolist() == list(range(7)) and rows["index"].tolist() == list(range(7))
    assert rows["writer"].tolist() == [99] * 6 + [1]
    rb.shared.slots.commit(torch.tensor([7]), torch.tensor([7]))
    rb.shared.slots.begin(torch.tensor([3]))  # a row between finished ones: left out, the rest kept
    assert rb.sample_all()["seq"].tolist() == [0, 1, 2, 4, 5, 6, 7]
    rb.shared.slots.commit(torch.tensor([3]), torch.tensor([3]))
    assert rb.sample_all()["seq"].tolist() == list(range(8)) and rb.pointer == 8
    rb.close()


# ---------------------------------------------------------------------- buffers inherited through fork unshared
#: Buffers a fork child finds without being handed them (as a DataLoader or vector-env worker would).
INHERITED: dict[str, ReplayBuffer] = {}


def write_inherited(expected: list[int], close: bool) -> None:
    """A fork child of a buffer that was never shared: reads work, every write is refused, nothing changes."""
    from objectrl_buffer.errors import ForkedBufferError

    rb = INHERITED["rb"]
    assert rb.sample_all()["seq"].tolist() == expected  # reads are allowed
    assert_consistent(rb.sample_batch(8))
    for call in (
        lambda: rb.add(one(1, 0)),
        lambda: rb.add_batch(tagged(1, torch.arange(3))),
        lambda: rb.extend(tagged(1, torch.arange(3))),
        lambda: rb.reset(),
        lambda: rb.reset(5),
    ):
        with pytest.raises(ForkedBufferError, match="share"):
            call()
    assert len(rb) == len(expected) and rb.sample_all()["seq"].tolist() == expected
    if close:
        rb.close()  # the parent owns the files: the child's close leaves them alone


@pytest.mark.parametrize("close", [False, True])
def test_a_fork_child_cannot_corrupt_the_rows_of_a_buffer_never_shared(close: bool) -> None:
    rb = INHERITED["rb"] = seeded_buffer(10, rows=10)  # full: a child's first add would land on parent's slot 0
    before = rb.sample_all()
    proc = mp.get_context("fork").Process(target=write_inherited, args=(before["seq"].tolist(), close))
    proc.start()
    proc.join()
    after = rb.sample_all()
    assert torch.equal(after["writer"], before["writer"]) and torch.equal(after["seq"], before["seq"])  # intact
    assert proc.exitcode == 0 and not is_shared(rb)
    rb.add(one(99, 10))  # the parent writes on as before, into its own files
    assert rb.sample_all()["seq"].tolist() == list(range(1, 11))
    rb.close()


def write_then_report(rb: ReplayBuffer | None, queue: Any) -> None:
    rb = INHERITED["rb"] if rb is None else rb
    try:
        rb.add(one(1, 0))
        queue.put("stored")
    except Exception as exc:  # the test reads the class name and message
        queue.put(f"{type(exc).__name__}: {exc}")


def test_an_unwritten_buffer_and_a_buffer_with_storage_dir_are_guarded_too(tmp_path: Any) -> None:
    ctx = mp.get_context("fork")
    for rb in (ReplayBuffer("cpu", "cpu", 10, seed=0), ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)):
        INHERITED["rb"] = rb
        queue = ctx.SimpleQueue()
        proc = ctx.Process(target=write_then_report, args=(None, queue))
        proc.start()
        proc.join()
        message = queue.get()
        assert message.startswith("ForkedBufferError") and "Queue" in message and "Process argument" in message
        assert "sharing it at the fork failed" not in message  # it was not handed over
        rb.add(one(99, 0))
        assert rb.sample_all()["seq"].tolist() == [0]
        rb.close()


def test_a_buffer_handed_to_a_fork_child_that_cannot_be_shared_is_guarded_and_says_why() -> None:
    ctx = mp.get_context("fork")
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0)  # no row yet: no schema to lay shared columns out by
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=write_then_report, args=(rb, queue))
    with pytest.warns(RuntimeWarning, match="could not be shared.*add a row"):
        proc.start()  # an at-fork hook cannot stop the fork: the parent is warned
    proc.join()
    message = queue.get()
    assert message.startswith("ForkedBufferError") and "sharing it at the fork failed" in message
    assert "add a row" in message and not is_shared(rb)
    rb.add(one(99, 0))  # the parent's buffer is as it was
    assert rb.sample_all()["seq"].tolist() == [0] and len(rb) == 1
    rb.close()


def test_shared_buffers_and_buffers_made_in_the_child_are_not_guarded() -> None:
    ctx = mp.get_context("fork")
    rb = seeded_buffer(100, rows=3)
    share_now(rb)
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=write_then_report, args=(rb, queue))  # shared before the fork: writes go through
    proc.start()
    proc.join()
    assert queue.get() == "stored" and len(rb) == 4
    rb.close()
    proc = ctx.Process(target=make_and_write, args=(queue,))
    proc.start()
    proc.join()
    assert queue.get() == 3


def make_and_write(queue: Any) -> None:
    rb = seeded_buffer(10, rows=3)  # made after the fork: an ordinary buffer of this process
    queue.put(len(rb))
    rb.close()


def share_or_copy_inherited(queue: Any) -> None:
    from objectrl_buffer.errors import ForkedBufferError

    rb = INHERITED["rb"]
    with pytest.raises(ForkedBufferError, match="before forking"):
        mp.get_context("fork").SimpleQueue().put(rb)  # a child cannot share the parent's rows onward
    copied = pickle.loads(pickle.dumps(rb))  # a plain copy is an ordinary buffer of this process
    copied.add(one(1, 0))
    queue.put((len(copied), copied.sample_all()["writer"].tolist()[-1]))
    copied.close()


def test_in_the_child_an_inherited_buffer_can_be_copied_but_not_shared_onward() -> None:
    ctx = mp.get_context("fork")
    rb = INHERITED["rb"] = seeded_buffer(10, rows=4)
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=share_or_copy_inherited, args=(queue,))
    proc.start()
    proc.join()
    assert proc.exitcode == 0 and queue.get() == (5, 1)
    assert len(rb) == 4 and rb.sample_all()["writer"].tolist() == [99] * 4
    rb.close()


RAW_FORK = """
import os, sys
from objectrl_buffer import ReplayBuffer
rb = ReplayBuffer("cpu", "cpu", 10, seed=0)
rb.add({"x": 1.0})
folder = rb.storage_folder
if os.fork() == 0:
    sys.exit(0)  # a raw fork child that exits normally runs the inherited atexit finalizers
os.wait()
print(os.path.isdir(folder))
"""


def test_a_raw_fork_child_exiting_normally_leaves_the_parents_files() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RAW_FORK], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "True"


# ---------------------------------------------------------------------- handed to a fork child: shared at the fork
class Writer(mp.get_context("fork").Process):  # type: ignore[name-defined,misc]
    """A ``Process`` subclass holding its buffer as an attribute."""

    def __init__(self, rb: ReplayBuffer, writer: int) -> None:
        super().__init__()
        self.rb, self.writer = rb, writer

    def run(self) -> None:
        write(self.rb, self.writer, 300)


class Actor:
    def __init__(self, rb: ReplayBuffer) -> None:
        self.rb = rb

    def act(self, writer: int) -> None:
        write(self.rb, writer, 300)


def write_kw(*, buffer: ReplayBuffer, writer: int) -> None:
    write(buffer, writer, 300)


def write_from_list(buffers: list[ReplayBuffer], writer: int) -> None:
    write(buffers[0], writer, 300)


def write_ranked(rank: int, rb: ReplayBuffer) -> None:
    write(rb, rank, 300)


POOLED: dict[str, ReplayBuffer] = {}


def keep_for_pool(rb: ReplayBuffer) -> None:
    POOLED["rb"] = rb


def write_pooled(writer: int) -> int:
    write(POOLED["rb"], writer, 300)
    return writer


@pytest.mark.parametrize("how", ["kwargs", "list", "subclass", "bound", "torch.multiprocessing"])
def test_a_buffer_handed_to_a_fork_child_any_way_is_shared_at_the_fork(how: str) -> None:
    ctx = mp.get_context("fork")
    rb = seeded_buffer(2_001)
    if how == "torch.multiprocessing":
        import torch.multiprocessing as tmp

        tmp.start_processes(write_ranked, args=(rb,), nprocs=2, start_method="fork")  # args nested in args
    else:
        procs = {
            "kwargs": lambda w: ctx.Process(target=write_kw, kwargs={"buffer": rb, "writer": w}),
            "list": lambda w: ctx.Process(target=write_from_list, args=([rb], w)),
            "subclass": lambda w: Writer(rb, w),
            "bound": lambda w: ctx.Process(target=Actor(rb).act, args=(w,)),
        }[how]
        run = [procs(w) for w in range(2)]
        for p in run:
            p.start()
        for p in run:
            p.join()
            assert p.exitcode == 0
    assert is_shared(rb)
    assert_all_there(rb, 2, 300)
    rb.close()


def test_pool_workers_forked_with_the_buffer_in_initargs_share_it() -> None:
    rb = seeded_buffer(2_001)
    with mp.get_context("fork").Pool(2, initializer=keep_for_pool, initargs=(rb,)) as pool:
        assert sorted(pool.map(write_pooled, range(2))) == [0, 1]
    assert_all_there(rb, 2, 300)
    rb.close()


def test_in_one_fork_the_buffer_handed_over_is_shared_and_the_other_guarded() -> None:
    ctx = mp.get_context("fork")
    handed = seeded_buffer(1_001)
    other = INHERITED["rb"] = seeded_buffer(10, rows=3)
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=write_both, args=(handed, queue))
    proc.start()
    proc.join()
    assert proc.exitcode == 0 and queue.get().startswith("ForkedBufferError")
    assert is_shared(handed) and not is_shared(other)
    assert_all_there(handed, 1, 300)
    assert len(other) == 3
    handed.close()
    other.close()


def write_both(rb: ReplayBuffer, queue: Any) -> None:
    write(rb, 0, 300)
    write_then_report(None, queue)


def test_a_prioritized_buffer_handed_to_a_fork_child_shares_rows_and_priorities() -> None:
    per = PrioritizedReplayBuffer("cpu", "cpu", 1_001, seed=0)
    per.add(one(99, 0))
    proc = mp.get_context("fork").Process(target=write, args=(per, 0, 300))
    proc.start()
    proc.join()
    assert proc.exitcode == 0 and is_shared(per)
    assert_all_there(per, 1, 300)
    batch = per.sample_batch(64)
    per.update_priority(batch["index"], torch.full((64,), 5.0))  # the child's rows are drawn by priority here
    assert per.max_priority == pytest.approx(5.0)
    per.close()


def test_a_thread_sampling_while_the_buffer_becomes_shared_always_finds_its_rows(monkeypatch: Any) -> None:
    from objectrl_buffer.distributed import become_shared

    rb = seeded_buffer(100, rows=10)
    engine, clear = rb.engine, rb.engine.clear
    seen: list[int] = []

    def clear_and_look() -> None:  # the moment a sampling thread could run between the two steps
        seen.append(rb.sample_batch(4).batch_size[0])
        clear()
        seen.append(rb.sample_batch(4).batch_size[0])

    monkeypatch.setattr(engine, "clear", clear_and_look)
    become_shared(rb)
    assert seen == [4, 4] and len(rb) == 10
    rb.close()


def do_nothing(rb: ReplayBuffer) -> None:
    pass


@pytest.mark.parametrize("how", ["fork Process argument", "Queue"])
def test_rows_a_writer_thread_adds_while_the_buffer_becomes_shared_are_kept(how: str) -> None:
    import threading

    rb = ReplayBuffer("cpu", "cpu", 4_000_000, seed=0)  # never wraps here: every id must be there
    for i in range(20_000):
        rb.add({"i": i})
    stop, added = threading.Event(), [20_000]

    def writer() -> None:  # the one writer thread; the main thread hands the buffer over meanwhile
        i = 20_000
        while not stop.is_set():
            rb.add({"i": i})
            i += 1
            added[0] = i

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.02)
    if how == "Queue":
        share_now(rb)
    else:
        proc = mp.get_context("fork").Process(target=do_nothing, args=(rb,))
        proc.start()
        proc.join()
    time.sleep(0.02)
    stop.set()
    thread.join()
    assert is_shared(rb) and added[0] < rb.buffer_size
    ids = rb.sample_all()["i"].tolist()
    assert sorted(ids) == list(range(added[0]))  # none lost (a few may be stored out of order), none twice
    assert len(rb) == rb.total_adds == added[0]
    rb.close()
