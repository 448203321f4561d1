"""Processes saving the same path at the same moment: every save that returns leaves a checkpoint that loads.

Writers of one path take turns (a lock the kernel releases when its holder dies), and cleanup never
removes the data folder that the metadata names.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import wait_for_cleanup
from objectrl_buffer.cli import commands as cli
from tests.support import assert_same, deadline, forkserver, full_snapshot, save_and_hang, save_version_at_once, version

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forkserver + SIGKILL: Linux")

SAVERS = 4
ROUNDS = 5


def generations_in(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if ".data-" in name)


def test_simultaneous_saves_of_one_path_leave_one_of_them_intact(tmp_path: Path) -> None:
    storage, folder = str(tmp_path / "storage"), tmp_path / "ck"
    folder.mkdir()
    path = str(folder / "run")
    expected = []
    for v in range(SAVERS):
        rb = version(storage, v)
        expected.append(full_snapshot(rb))
        rb.close()
    ctx = forkserver()
    for round_ in range(ROUNDS):
        barrier = ctx.Barrier(SAVERS)
        savers = [ctx.Process(target=save_version_at_once, args=(path, storage, v, barrier)) for v in range(SAVERS)]
        for proc in savers:
            proc.start()
        for proc in savers:
            proc.join(120)
        assert [proc.exitcode for proc in savers] == [0] * SAVERS, f"round {round_}"
        with ReplayBuffer.from_checkpoint(path, storage_dir=storage) as rb:
            loaded = full_snapshot(rb)
        matches = []
        for v in range(SAVERS):
            try:
                assert_same(loaded, expected[v])
                matches.append(v)
            except AssertionError:
                pass
        assert len(matches) == 1, f"round {round_}: the checkpoint is none of the saved buffers"
        assert cli.main(["verify", path]) == 0
        assert len(generations_in(folder)) == 1 and sorted(os.listdir(folder))[-1] == "run.metadata"


def test_a_saver_killed_while_holding_the_lock_does_not_block_the_next_save(tmp_path: Path) -> None:
    storage, folder = str(tmp_path / "storage"), tmp_path / "ck"
    folder.mkdir()
    path, flag = str(folder / "run"), str(tmp_path / "flag")
    version(storage, 0).save(path, data=True)
    child = forkserver().Process(target=save_and_hang, args=(path, storage, 1, flag))
    child.start()
    try:
        for _ in range(1200):  # the child writes its data folder under the lock, then hangs there
            if os.path.exists(flag) or not child.is_alive():
                break
            time.sleep(0.05)
        assert os.path.exists(flag), "the child never wrote its data folder"
        fd = os.open(path + ".metadata.lock", os.O_RDWR)
        try:
            with pytest.raises(OSError) as info:  # held, under the documented name, for other tools too
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert info.value.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert len(generations_in(folder)) == 2  # the killed saver's complete but unreferenced folder
    rb = version(storage, 2)
    with deadline(60):
        rb.save(path, data=True)
    wait_for_cleanup()
    with ReplayBuffer.from_checkpoint(path, storage_dir=storage) as loaded:
        assert_same(full_snapshot(loaded), full_snapshot(rb))
    assert len(generations_in(folder)) == 1 and "run.metadata.lock" not in os.listdir(folder)
