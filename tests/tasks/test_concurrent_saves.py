"""Processes saving task buffers into one folder at the same moment: every save returns, and the folder then
loads as exactly one of the saved buffers (saves of one folder take turns under a kernel-released lock)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer.core.sync import lock_file
from objectrl_buffer.tasks import InMemoryStorage, TaskReplayBuffer
from tests.support import deadline
from tests.tasks.workers import step_row

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork + flock: Linux")


def saved_buffer(version: int) -> TaskReplayBuffer:
    """Buffer ``version``: 12 tasks of 20 fat-ish rows (a save writes a few hundred kB, so saves overlap)."""
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=1000))
    for t in range(12):
        rb.store_batch([step_row(version, t, s, pad=100) for s in range(20)])
    return rb


def ids(rb: TaskReplayBuffer) -> list[str]:
    return [r.id for r in rb.storage.get_all()]


def save_at_once(path: str, version: int, barrier: Any, out: Any) -> None:
    """Child: build buffer ``version``, wait for the other savers, save into ``path``; report its row ids."""
    rb = saved_buffer(version)
    out.put((version, ids(rb)))
    barrier.wait(30)
    rb.save(path)


def run_rounds(folder: Path, savers: int, rounds: int) -> int:
    """``rounds`` rounds of ``savers`` processes saving into ``folder``; returns the rounds that loaded."""
    ctx = multiprocessing.get_context("fork")
    loaded_rounds = 0
    for round_ in range(rounds):
        barrier, out = ctx.Barrier(savers), ctx.Queue()
        procs = [ctx.Process(target=save_at_once, args=(str(folder), v, barrier, out)) for v in range(savers)]
        for p in procs:
            p.start()
        saved = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * savers, f"round {round_}: a save did not return"
        rb = TaskReplayBuffer(InMemoryStorage(max_capacity=1000))
        rb.load(folder)  # raised CheckpointNotFoundError on the old code: a save deleted the files of another
        assert ids(rb) in saved.values(), f"round {round_}: the folder holds none of the saved buffers"
        names = sorted(os.listdir(folder))
        assert len(names) == 4 and not [n for n in names if n.endswith(".tmp")], names  # no leftovers
        loaded_rounds += 1
    return loaded_rounds


def test_simultaneous_saves_into_one_folder_leave_one_of_them(tmp_path: Path) -> None:
    assert run_rounds(tmp_path / "ckpt", savers=3, rounds=3) == 3


def hold_save_lock(folder: str, held: Any) -> None:
    """Child: take the folder's save lock (as a save does from its first file to its cleanup), then hang."""
    with lock_file(os.path.join(folder, "manifest.json.lock")):
        held.set()
        time.sleep(600)


def test_a_saver_killed_holding_the_lock_blocks_no_later_save(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    saved_buffer(0).save(folder)
    ctx = multiprocessing.get_context("fork")
    held = ctx.Event()
    child = ctx.Process(target=hold_save_lock, args=(str(folder), held))
    child.start()
    try:
        assert held.wait(30)
        fd = os.open(folder / "manifest.json.lock", os.O_RDWR)
        try:  # a save holds the lock under this name (other tools can wait for saves too)
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.join(30)
    rb = saved_buffer(1)
    with deadline(30):  # the kernel released the dead saver's lock
        rb.save(folder)
    loaded = TaskReplayBuffer(InMemoryStorage(max_capacity=1000))
    loaded.load(folder)
    assert ids(loaded) == ids(rb) and len(os.listdir(folder)) == 4


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="set RUN_SLOW=1")
def test_simultaneous_saves_many_rounds(tmp_path: Path) -> None:
    rounds = int(os.environ.get("TASK_SAVE_ROUNDS", "40"))
    assert run_rounds(tmp_path / "ckpt", savers=4, rounds=rounds) == rounds
    print(f"{rounds} rounds x 4 savers: every round loaded")
