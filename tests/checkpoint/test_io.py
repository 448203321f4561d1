"""checkpoint/io.py: the durable writes (file modes)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.io import atomic_write
from tests.support import fill_rows


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_write_creates_the_file_with_the_users_umask(tmp_path: Path, mask: int) -> None:
    with umask(mask):
        atomic_write(str(tmp_path / "f"), lambda f: f.write(b"x"))
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temp file left


def test_the_metadata_file_is_readable_by_the_group_under_umask_022(tmp_path: Path) -> None:
    rb = ReplayBuffer("cpu", "cpu", 4, storage_dir=tmp_path / "storage")
    try:
        fill_rows(rb, 3)
        with umask(0o022):
            rb.save(tmp_path / "run", data=True)
    finally:
        rb.close()
    assert stat.S_IMODE((tmp_path / "run.metadata").stat().st_mode) == 0o644


@pytest.mark.parametrize("durable", [True, False])
def test_atomic_write_syncs_unless_the_caller_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """durable=True: fsync of the file and of its folder; durable=False: none (the caller syncs a batch
    later), the file's writeback started instead. The file is whole and in place either way."""
    from objectrl_buffer.checkpoint import io

    fsyncs: list[int] = []
    started: list[int] = []
    real_fsync, real_start = os.fsync, io.start_writeback
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(io, "start_writeback", lambda fd: (started.append(fd), real_start(fd))[1])
    target = tmp_path / "f.bin"
    io.atomic_write(str(target), lambda f: f.write(b"x" * 100_000), durable=durable)
    assert target.read_bytes() == b"x" * 100_000 and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
    assert (len(fsyncs), len(started)) == ((2, 0) if durable else (0, 1))
    io.start_writeback(-1)  # best effort: a bad descriptor is not an error
