"""Every bad checkpoint input raises a clear error naming the path and the problem, and changes nothing.

Loads: the buffer keeps its rows, counters, generator and shuffle. Saves: the previous checkpoint at the
path stays intact and loadable, and no new files are left behind.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint import data as checkpoint_data
from objectrl_buffer.checkpoint.generations import wait_for_cleanup
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from tests.support import (
    assert_same,
    data_folder,
    edit_manifest,
    fill_rows,
    full_snapshot,
    saved_wrapped_checkpoint,
    signed,
    tree,
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A full checkpoint at ``<tmp>/ck/run`` of a wrapped buffer (capacity 8, 13 rows added)."""
    return saved_wrapped_checkpoint(tmp_path)


@pytest.fixture
def target(tmp_path: Path) -> ReplayBuffer:
    """The buffer a bad load is tried on: it holds other rows of the same capacity and schema."""
    rb = ReplayBuffer("cpu", "cpu", 8, seed=5, shuffle=False, storage_dir=tmp_path / "storage")
    fill_rows(rb, 3, first=500)
    return rb


def refused(rb: ReplayBuffer, path: Path, error: type[Exception], *patterns: str) -> None:
    """``rb.load(path)`` raises ``error`` whose message names ``path`` and each pattern; ``rb`` unchanged."""
    before = full_snapshot(rb)
    with pytest.raises(error) as info:
        rb.load(path)
    message = str(info.value)
    assert str(path) in message, message
    for pattern in patterns:
        assert pattern in message, message
    assert_same(full_snapshot(rb), before)


def first_column(path: Path, suffix: str = "-step.bin") -> Path:
    return next(Path(data_folder(path)).glob("*" + suffix))


# ---------------------------------------------------------------------------------------------- missing things
def test_missing_metadata(tmp_path: Path, target: ReplayBuffer) -> None:
    refused(target, tmp_path / "nothing", CheckpointNotFoundError, "no buffer checkpoint")
    with pytest.raises(FileNotFoundError):  # the builtin a user would catch
        target.load(tmp_path / "nothing")


def test_missing_data_folder(saved: Path, target: ReplayBuffer) -> None:
    shutil.rmtree(data_folder(saved))
    refused(target, saved, CheckpointNotFoundError, "data folder", "does not exist")


def test_missing_manifest_and_column_file(saved: Path, target: ReplayBuffer) -> None:
    column = first_column(saved)
    column.unlink()
    refused(target, saved, CheckpointNotFoundError, column.name, "is missing")
    os.unlink(os.path.join(data_folder(saved), "manifest.json"))
    refused(target, saved, CheckpointNotFoundError, "manifest.json")


# ---------------------------------------------------------------------------------------------- damaged files
def test_truncated_column(saved: Path, target: ReplayBuffer) -> None:
    column = first_column(saved)
    column.write_bytes(column.read_bytes()[:-3])
    refused(target, saved, CheckpointError, column.name, "truncated")


def test_corrupted_column_fails_its_checksum(saved: Path, target: ReplayBuffer) -> None:
    column = first_column(saved, "-frame.bin")
    data = bytearray(column.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    column.write_bytes(bytes(data))
    refused(target, saved, CheckpointError, column.name, "checksum mismatch")


def test_corrupted_manifest(saved: Path, target: ReplayBuffer) -> None:
    manifest = Path(data_folder(saved), "manifest.json")
    manifest.write_text(manifest.read_text().replace('"pointer": 5', '"pointer": 4'))
    refused(target, saved, CheckpointError, "manifest.json", "corrupted")
    manifest.write_text("{not json")
    edit_manifest_crc_only(saved)
    refused(target, saved, CheckpointError, "manifest.json", "not valid JSON")


def edit_manifest_crc_only(path: Path) -> None:
    import zlib

    meta_file = f"{path}.metadata"
    meta = torch.load(meta_file, weights_only=True)
    meta["data_manifest_crc32"] = zlib.crc32(Path(data_folder(path), "manifest.json").read_bytes())
    torch.save(signed(meta), meta_file)


def test_truncated_and_garbage_metadata(saved: Path, target: ReplayBuffer) -> None:
    meta_file = Path(f"{saved}.metadata")
    good = meta_file.read_bytes()
    meta_file.write_bytes(good[: len(good) // 2])
    refused(target, saved, CheckpointError, "not a readable metadata file")
    meta_file.write_bytes(b"\x00" * 40)
    refused(target, saved, CheckpointError, "not a readable metadata file")


class _Payload:
    """Unpickling this would create the marker file: proof that loading executed code."""

    marker = ""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (open, (self.marker, "w"))


def test_pickled_object_in_metadata_is_refused_unexecuted(saved: Path, target: ReplayBuffer, tmp_path: Path) -> None:
    payload = _Payload()
    payload.marker = str(tmp_path / "executed")
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    torch.save({**meta, "evil": payload}, f"{saved}.metadata")
    refused(target, saved, CheckpointError, "not a readable metadata file")
    with open(f"{saved}.metadata", "wb") as f:  # a bare pickle, not even torch's zip format
        pickle.dump(payload, f, protocol=2)
    refused(target, saved, CheckpointError, "not a readable metadata file")
    assert not (tmp_path / "executed").exists()


def test_future_format_versions(saved: Path, target: ReplayBuffer) -> None:
    edit_manifest(saved, lambda m: m.update(format_version=99))
    refused(target, saved, CheckpointError, "data format version 99", "upgrade")
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    torch.save({**meta, "format_version": 7}, f"{saved}.metadata")
    refused(target, saved, CheckpointError, "format version 7", "upgrade")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m["ring"].update(pointer=3), "disagree on the ring state"),
        (lambda m: m["columns"][0].update(dtype="float128"), "unknown dtype"),
        (lambda m: m["columns"][0].update(file="../../etc/passwd"), "bad file name"),
        (lambda m: m["columns"][0].update(shape=[5]), "records"),
        (lambda m: m["sampling"]["generator"].update(state="AAAA"), "invalid generator state"),
        (lambda m: m.pop("columns"), "missing or malformed"),
    ],
)
def test_inconsistent_manifest(saved: Path, target: ReplayBuffer, change: Callable[[dict], None], problem: str) -> None:
    edit_manifest(saved, change)
    refused(target, saved, CheckpointError, problem)


def test_data_dir_pointing_elsewhere_is_refused(saved: Path, target: ReplayBuffer, tmp_path: Path) -> None:
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    for elsewhere in ["../storage", "/etc", "other.data-0123456789abcdef", 42]:
        torch.save(signed({**meta, "data_dir": elsewhere}), f"{saved}.metadata")  # refused even with a good crc32
        refused(target, saved, CheckpointError, "is not a data folder of this checkpoint")


# ---------------------------------------------------------------------------------------------- wrong kinds of path
def test_file_where_a_folder_is_expected_and_the_reverse(saved: Path, target: ReplayBuffer, tmp_path: Path) -> None:
    folder = data_folder(saved)
    shutil.rmtree(folder)
    Path(folder).write_bytes(b"not a folder")
    refused(target, saved, CheckpointError, "is a file, expected the checkpoint's data folder")
    os.unlink(f"{saved}.metadata")
    os.mkdir(f"{saved}.metadata")
    refused(target, saved, CheckpointError, "is a folder, expected a metadata file")
    with pytest.raises(CheckpointError, match="is a folder, expected a metadata file"):
        target.save(saved, data=True)
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(CheckpointError, match="a-file' is a file, expected a folder"):
        target.save(tmp_path / "a-file" / "sub" / "run", data=True)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        target.save(tmp_path / "no-such-folder" / "run")


# ---------------------------------------------------------------------------------------------- failed saves
def assert_previous_intact(path: Path, before: dict[str, bytes]) -> None:
    wait_for_cleanup()
    assert tree(path.parent) == before  # same files, same bytes: nothing added, nothing removed
    rb = ReplayBuffer.from_checkpoint(path, storage_dir=path.parent.parent / "storage")
    assert (len(rb), rb.pointer) == (8, 5)


def test_disk_full_during_save(saved: Path, target: ReplayBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree(saved.parent)
    real, calls = checkpoint_data.write_all, []

    def fill_up(fd: int, data: memoryview) -> None:
        calls.append(len(data))
        if len(calls) == 3:  # the third column: the disk is full after half of it
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(checkpoint_data, "write_all", fill_up)
    with pytest.raises(CheckpointError, match="No space left on device") as info:
        target.save(saved, data=True)
    assert str(saved) in str(info.value) and "previous checkpoint is intact" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert_previous_intact(saved, before)


def test_failure_writing_the_metadata_keeps_the_old_checkpoint(
    saved: Path, target: ReplayBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tree(saved.parent)

    def replace_fails(src: str, dst: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "replace", replace_fails)
    with pytest.raises(CheckpointError, match="Input/output error"):
        target.save(saved, data=True)
    monkeypatch.undo()
    assert_previous_intact(saved, before)


def test_save_of_counters_without_rows_is_refused(saved: Path, tmp_path: Path) -> None:
    meta_only = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path / "storage")
    torch.save({"buffer_size": 8, "data_size": 8, "pointer": 0}, tmp_path / "counters.metadata")
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        meta_only.load(tmp_path / "counters")  # ObjectRL semantics: 8 rows counted, none held
    before = tree(saved.parent)
    with pytest.raises(CheckpointError, match="counts 8 rows but holds none"):
        meta_only.save(saved, data=True)
    assert tree(saved.parent) == before


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make ``folder`` unwritable: chmod for a normal user; as root (which ignores modes) the immutable flag."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("running as root without a way to make a folder read-only (chattr +i unavailable)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_read_only_destination(saved: Path, target: ReplayBuffer) -> None:
    before = tree(saved.parent)
    with read_only(saved.parent):
        for data in (True, False):
            with pytest.raises(CheckpointError) as info:
                target.save(saved, data=data)
            message = str(info.value)
            assert str(saved) in message and ("Permission denied" in message or "not permitted" in message), message
    assert_previous_intact(saved, before)
