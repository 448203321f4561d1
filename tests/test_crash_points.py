"""Every crash point of a save: the child kills itself right before its k-th file-system call.

For k = 1, 2, ... until a save gets through, each time load gives exactly the checkpoint from before the
save (crashes up to the switch of the metadata file) or exactly the new one (crashes after it, during
cleanup), never anything else, and the first successful save removes what the crashes left.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from checkpoint_helpers import assert_same, forkserver, snapshot, version

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import wait_for_cleanup

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver + SIGKILL: Linux")

CALLS = ("open", "write", "fsync", "close", "mkdir", "replace", "unlink", "rmdir", "scandir", "rename")


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
    ctx, on_disk, outcomes = forkserver(), 0, []
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
