"""SharedTaskStorage: writers in spawned and forked processes, a concurrent reader, store_batch from a child,
and writers SIGKILLed mid-store that never block the next store nor leave a torn row visible."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.tasks import MultiProcMemoryStorage, QueryBuilder, SharedTaskStorage, TaskReplayBuffer
from tests.support import deadline
from tests.tasks.workers import consistent, read_while_writing, step_row, store_forever, write_tasks

SLOW = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="set RUN_SLOW=1")


def _context(method: str) -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":  # children fork from a server that imported torch once: a child costs no import
        ctx.set_forkserver_preload(["objectrl_buffer.tasks", "tests.tasks.workers"])
    return ctx


@pytest.mark.parametrize(
    "method",
    ["forkserver", pytest.param("spawn", marks=[pytest.mark.slow, SLOW])],  # spawn: 5 torch imports, ~10-20 s
)
def test_four_writers_and_a_reader(tmp_path: Path, method: str) -> None:
    ctx = _context(method)
    rb = TaskReplayBuffer(SharedTaskStorage(max_capacity=10000, path=tmp_path / "rows"), seed=0)
    out = ctx.Queue()
    writers = [ctx.Process(target=write_tasks, args=(rb, w, 10, 10, w % 2 == 0)) for w in range(4)]
    reader = ctx.Process(target=read_while_writing, args=(rb, 400, out))
    for p in [*writers, reader]:
        p.start()
    for p in [*writers, reader]:
        p.join(60)
        assert p.exitcode == 0
    assert out.get(timeout=5) == (0, 400)
    rows = rb.storage.get_all()
    assert len(rows) == 400 and all(map(consistent, rows))
    for task_id in {r.exp_meta.task_id for r in rows}:
        assert sorted(r.exp_meta.step for r in rb.storage.get_by_task_id(task_id)) == list(range(10))
    assert rb.storage.size(QueryBuilder().eq("agent_id", "agent2").build()) == 100


def test_fork_children_share_rows_and_capacity(tmp_path: Path) -> None:
    storage = MultiProcMemoryStorage(data_dict={}, fifo_queue=[], lock=None, max_capacity=50)
    rb = TaskReplayBuffer(storage)
    rb.store(step_row(9, 0, 0))
    assert len(rb) == 1  # the parent's mirror is up to date before fork
    ctx = multiprocessing.get_context("fork")
    with deadline(20):
        children = [ctx.Process(target=write_tasks, args=(rb, w, 4, 10, True)) for w in range(2)]
        for p in children:
            p.start()
        for p in children:
            p.join()
    assert [p.exitcode for p in children] == [0, 0]
    assert len(rb) == 50  # 81 rows stored, whole oldest tasks evicted down to the capacity
    counts: dict[str, int] = {}
    for r in rb.storage.get_all():
        counts[r.exp_meta.task_id] = counts.get(r.exp_meta.task_id, 0) + 1
    assert set(counts.values()) == {10}  # tasks whole


def test_store_batch_from_a_spawned_child_returns(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    rb = TaskReplayBuffer(SharedTaskStorage(path=tmp_path / "rows"))
    child = ctx.Process(target=write_tasks, args=(rb, 0, 3, 50, True))
    child.start()
    child.join(30)
    assert child.exitcode == 0, "store_batch in a child did not return"
    assert len(rb) == 150


def test_sigkilled_writers_never_block_nor_tear(tmp_path: Path) -> None:
    kills = 20 if os.environ.get("RUN_SLOW") == "1" else 5
    rb = TaskReplayBuffer(SharedTaskStorage(max_capacity=400, path=tmp_path / "rows"))
    ctx = multiprocessing.get_context("fork")
    for k in range(kills):
        ready = ctx.Event()
        child = ctx.Process(target=store_forever, args=(rb, k, ready))
        child.start()
        assert ready.wait(10)
        time.sleep(0.02 + 0.013 * (k % 5))
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        with deadline(10):  # the next store takes the lock the dead writer held
            rb.store_batch([step_row(100 + k, 0, s) for s in range(3)])
        rows = rb.storage.get_all()
        assert all(map(consistent, rows))
        assert len(rows) <= 400
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.exp_meta.task_id] = counts.get(r.exp_meta.task_id, 0) + 1
        assert all(n in (3, 8) for n in counts.values())  # every store whole
    fresh = SharedTaskStorage(max_capacity=400, path=tmp_path / "rows")  # another process's view agrees
    assert [r.id for r in fresh.get_all()] == [r.id for r in rb.storage.get_all()]


def test_a_folder_keeps_its_capacity(tmp_path: Path) -> None:
    SharedTaskStorage(max_capacity=5, path=tmp_path)
    with pytest.raises(InvalidArgumentError, match="max_capacity=5"):
        SharedTaskStorage(max_capacity=6, path=tmp_path)


def test_temporary_folder_is_removed_with_its_storage() -> None:
    storage = SharedTaskStorage()
    folder = storage.path
    storage.add(step_row(0, 0, 0))
    assert os.path.isdir(folder)
    storage.close()
    del storage
    import gc

    gc.collect()
    assert not os.path.exists(folder)
