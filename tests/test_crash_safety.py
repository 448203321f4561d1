"""A save that dies at any moment leaves the complete previous checkpoint or the complete new one.

* Random SIGKILLs of a process saving ~200 MB over and over (tests/stress/kill_during_save.py, 20+ kills).
* Every crash point of one save: the child kills itself right before its k-th file-system call, for
  k = 1, 2, ... until a save gets through; each time, load gives exactly the old or exactly the new buffer.
* A real partial write: the kernel's file-size limit (RLIMIT_FSIZE) stops a save midway.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from checkpoint_helpers import SPEC, assert_same, rows, snapshot, tree

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint import wait_for_cleanup
from objectrl_buffer.errors import CheckpointError

sys.path.insert(0, str(Path(__file__).parent / "stress"))
import kill_during_save  # the stress script that runs 100+ kills; its code is shared

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver + SIGKILL + RLIMIT_FSIZE: Linux")

CALLS = ("open", "write", "fsync", "close", "mkdir", "replace", "unlink", "rmdir", "scandir", "rename")


def context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["objectrl_buffer", "kill_during_save", "checkpoint_helpers", __name__])
    return ctx


def version(storage: str, v: int) -> ReplayBuffer:
    """Buffer contents number ``v``: 13 rows for v=0, 19 for v=1 (other rows, other pointer).

    Three columns (float32, bool, int64): every step of a save repeats per column, so three cover the
    first, a middle and the last one with a third of the crash points that all nine keys would take.
    """
    rb = ReplayBuffer("cpu", "cpu", 16, seed=v, shuffle=bool(v), storage_dir=storage)
    rb.add_batch(rows(100 * v, 13 + 6 * v, {k: SPEC[k] for k in ("state", "terminated", "step")}))
    return rb


def test_random_sigkills_during_repeated_saves_of_200_mb(tmp_path: Path) -> None:
    stats = kill_during_save.run_kills(kills=22, workdir=str(tmp_path), seed=1)
    assert stats["kills"] == 22
    assert stats.get("load gave this saver's checkpoint", 0) >= 5  # kills also landed after completed saves
    assert sum(v for k, v in stats.items() if k.startswith("left a partial")) >= 5  # ... and in the middle of saves


def crash_at(path: str, storage: str, v: int, k: int) -> None:
    """Child: build version ``v`` and save it, SIGKILLing itself right before its k-th file-system call."""
    rb = version(storage, v)
    count = [0]

    def deadly(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return call

    for name in CALLS:
        setattr(os, name, deadly(getattr(os, name)))
    rb.save(path, data=True)
    wait_for_cleanup()


def test_every_crash_point_of_a_save(tmp_path: Path) -> None:
    """Crash before call k = 1, 2, ...: the checkpoint is the one before the save until the metadata switch,
    the new one from then on (in cleanup), never anything else. Each save writes the other version."""
    storage, path = str(tmp_path / "storage"), str(tmp_path / "ck" / "run")
    os.makedirs(os.path.dirname(path))
    expected = []
    for v in (0, 1):
        snap = snapshot(version(storage, v))
        expected.append(snap)
    version(storage, 0).save(path, data=True)
    ctx, on_disk, outcomes = context(), 0, []
    for k in range(1, 500):
        proc = ctx.Process(target=crash_at, args=(path, storage, 1 - on_disk, k))
        proc.start()
        proc.join()
        with ReplayBuffer.from_checkpoint(path, storage_dir=storage) as rb:
            loaded = snapshot(rb)
        matches = []
        for v in (0, 1):
            try:
                assert_same(loaded, expected[v])  # rows, counters, shuffle and generator state
                matches.append(v)
            except AssertionError:
                pass
        assert len(matches) == 1, f"crash before file-system call {k}: the checkpoint is neither old nor new"
        outcomes.append("kept" if matches[0] == on_disk else "switched")
        on_disk = matches[0]
        if proc.exitcode == 0:  # the save got through without reaching call k
            break
        assert proc.exitcode == -signal.SIGKILL
    else:
        raise AssertionError("the save never completed")
    switch = outcomes.index("switched")
    assert switch > 20 and outcomes == ["kept"] * switch + ["switched"] * (len(outcomes) - switch), outcomes
    assert len(os.listdir(os.path.dirname(path))) == 2  # the last save cleaned every crash's leftovers


def save_under_file_size_limit(path: str, storage: str, limit: int, report: str) -> None:
    """Child: save version 1 with the kernel refusing file growth past ``limit`` bytes; write what happened."""
    rb = version(storage, 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        rb.save(path, data=True)
        outcome = "saved"
    except CheckpointError as exc:
        outcome = f"{type(exc).__name__}: {exc} | cause: {exc.__cause__!r}"
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    Path(report).write_text(outcome)


def test_a_real_partial_write_fails_cleanly(tmp_path: Path) -> None:
    storage, path = str(tmp_path / "storage"), tmp_path / "ck" / "run"
    path.parent.mkdir()
    old = version(storage, 0)
    old.save(path, data=True)
    before = tree(path.parent)
    report = tmp_path / "report"
    proc = context().Process(target=save_under_file_size_limit, args=(str(path), storage, 500, str(report)))
    proc.start()
    proc.join()
    assert proc.exitcode == 0
    outcome = report.read_text()
    assert outcome.startswith("CheckpointError") and "File too large" in outcome and str(path) in outcome, outcome
    assert tree(path.parent) == before  # the half-written data folder is gone, the old checkpoint untouched
    assert_same(snapshot(ReplayBuffer.from_checkpoint(path, storage_dir=storage)), snapshot(old))
