"""A save that dies at any moment leaves the complete previous checkpoint or the complete new one.

* Random SIGKILLs of a process saving ~200 MB over and over (tests/stress/kill_during_save.py, 20+ kills).
* A real partial write: the kernel's file-size limit (RLIMIT_FSIZE) stops a save midway.
* Every crash point of one save, one by one: tests/test_crash_points.py.
"""

from __future__ import annotations

import resource
import signal
import sys
from pathlib import Path

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import CheckpointError
from tests.stress import kill_during_save  # the stress script that runs 100+ kills; its code is shared
from tests.support import assert_same, forkserver, full_snapshot, tree, version

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver + SIGKILL + RLIMIT_FSIZE: Linux")


def test_random_sigkills_during_repeated_saves_of_200_mb(tmp_path: Path) -> None:
    stats = kill_during_save.run_kills(kills=22, workdir=str(tmp_path), seed=1)
    assert stats["kills"] == 22
    assert stats.get("load gave this saver's checkpoint", 0) >= 3  # kills also landed after completed saves
    assert sum(v for k, v in stats.items() if k.startswith("left a partial")) >= 5  # ... and in the middle of saves


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
    proc = forkserver().Process(target=save_under_file_size_limit, args=(str(path), storage, 500, str(report)))
    proc.start()
    proc.join()
    assert proc.exitcode == 0
    outcome = report.read_text()
    assert outcome.startswith("CheckpointError") and "File too large" in outcome and str(path) in outcome, outcome
    assert tree(path.parent) == before  # the half-written data folder is gone, the old checkpoint untouched
    assert_same(full_snapshot(ReplayBuffer.from_checkpoint(path, storage_dir=storage)), full_snapshot(old))
