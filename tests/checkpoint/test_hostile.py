"""Hostile checkpoints, every checksum recomputed, are refused by validation: a CheckpointError naming the
path before anything is allocated, the buffer unchanged, and ``objectrl-buffer inspect``/``verify`` exit 1
with a one-line reason (an exception of another class would propagate out of ``cli.main`` and fail here).

Things that could block forever (a FIFO) run under a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.cli import commands as cli
from objectrl_buffer.errors import CheckpointError
from tests.support import (
    assert_same,
    data_folder,
    deadline,
    edit_manifest,
    edit_metadata,
    fill_rows,
    full_snapshot,
    replace_manifest,
    saved_wrapped_checkpoint,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, O_NOFOLLOW, SIGALRM: Linux")


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A full checkpoint at ``<tmp>/ck/run`` (capacity 8, 13 rows added: wrapped)."""
    return saved_wrapped_checkpoint(tmp_path)


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    """A full checkpoint of an empty buffer at ``<tmp>/ck/empty``: 0 rows, no column files (about 2 KB)."""
    (tmp_path / "ck").mkdir(exist_ok=True)
    rb = ReplayBuffer("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "storage")
    rb.save(tmp_path / "ck" / "empty", data=True)
    rb.close()
    return tmp_path / "ck" / "empty"


def refused(path: Path, capsys: pytest.CaptureFixture[str], *patterns: str) -> None:
    """Every way in refuses ``path`` with a CheckpointError whose message names it and each pattern:
    from_checkpoint, load into an empty buffer and into one holding rows (unchanged after), inspect, verify."""
    storage = path.parent.parent / "storage"
    holding = ReplayBuffer("cpu", "cpu", 8, seed=5, storage_dir=storage)
    fill_rows(holding, 3, first=500)
    fresh = ReplayBuffer("cpu", "cpu", 8, seed=5, storage_dir=storage)
    with deadline(60):
        attempts: list[Any] = [lambda: ReplayBuffer.from_checkpoint(path, storage_dir=storage)]
        attempts += [lambda rb=rb: rb.load(path) for rb in (fresh, holding)]
        for attempt in attempts:
            before = [full_snapshot(fresh), full_snapshot(holding)]
            with pytest.raises(CheckpointError) as info:
                attempt()
            message = str(info.value)
            assert str(path.parent) in message, message
            for pattern in patterns:
                assert pattern in message, message
            assert_same([full_snapshot(fresh), full_snapshot(holding)], before)
        for command in ("inspect", "verify"):
            capsys.readouterr()
            assert cli.main([command, str(path)]) == 1
            out, err = capsys.readouterr()
            assert out == "" and len(err.strip().splitlines()) == 1 and "FAILED" in err, err
    holding.close()
    fresh.close()


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("capacity", [2**63, 2**100])
def test_a_buffer_size_beyond_any_buffer(saved: Path, capacity: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A consistent ring (8 rows, pointer 8) that only its capacity makes hostile."""
    edit_manifest(saved, lambda m: m["ring"].update(buffer_size=capacity, pointer=8))
    edit_metadata(saved, lambda m: m.update(buffer_size=capacity, pointer=8))
    refused(saved, capsys, "buffer_size")


def test_a_metadata_only_checkpoint_with_a_buffer_size_beyond_any_buffer(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counters = saved.parent / "counters"
    ReplayBuffer.from_checkpoint(saved).save(counters)
    edit_metadata(counters, lambda m: m.update(buffer_size=2**63, pointer=8))
    refused(counters, capsys, "buffer_size")


def test_a_zero_row_checkpoint_declaring_a_1_gib_row(empty: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 rows, so 0-byte files fit any row: nothing may be allocated for what no file holds."""
    column = {"key": ["x"], "shape": [2**28], "dtype": "float32", "file": "000-x.bin", "bytes": 0, "crc32": "00000000"}
    edit_manifest(empty, lambda m: m["columns"].append(column))
    Path(data_folder(empty), "000-x.bin").touch()
    refused(empty, capsys, "0 rows")


def test_a_storage_larger_than_any_buffer(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A capacity that fits alone, times the bytes of a row, is more bytes than any storage can have."""

    def huge(m: dict[str, Any]) -> None:
        m["ring"].update(buffer_size=2**61, data_size=8, pointer=8)

    edit_manifest(saved, huge)
    edit_metadata(saved, lambda m: m.update(buffer_size=2**61, data_size=8, pointer=8))
    refused(saved, capsys, "bytes")


# ---------------------------------------------------------------------------------------------- parsing
def test_a_deeply_nested_manifest(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads(Path(data_folder(saved), "manifest.json").read_text())
    manifest["created"] = "NEST"
    depth = 200_000
    payload = json.dumps(manifest).replace('"NEST"', "[" * depth + "]" * depth).encode()
    replace_manifest(saved, payload)
    refused(saved, capsys, "manifest.json")


def test_a_5000_digit_integer_in_the_manifest(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = Path(data_folder(saved), "manifest.json").read_text()
    assert '"buffer_size": 8' in text
    replace_manifest(saved, text.replace('"buffer_size": 8', '"buffer_size": 1' + "0" * 4999).encode())
    refused(saved, capsys, "manifest.json")


@pytest.mark.parametrize("checksum", ["stale", "none"])
def test_a_5000_digit_integer_in_the_metadata(saved: Path, checksum: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Pickle holds such an int (JSON, hence the checksum, cannot): refused with a stale checksum or none."""
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    if checksum == "none":
        del meta["metadata_crc32"]
    torch.save({**meta, "pointer": 10**5000}, f"{saved}.metadata")
    refused(saved, capsys, "run.metadata")


# ---------------------------------------------------------------------------------------------- devices
@pytest.mark.parametrize("which", ["storing_device", "device"])
@pytest.mark.parametrize("recorded", ["meta", "no such device", ""])
def test_a_recorded_device_that_cannot_hold_rows(
    saved: Path, which: str, recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_manifest(saved, lambda m: m["devices"].update({which: recorded}))
    refused(saved, capsys, which)


# ---------------------------------------------------------------------------------------------- file kinds
def test_a_fifo_in_place_of_the_metadata(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.unlink(f"{saved}.metadata")
    os.mkfifo(f"{saved}.metadata")
    refused(saved, capsys, "FIFO")


def test_a_fifo_in_place_of_the_manifest(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = Path(data_folder(saved), "manifest.json")
    manifest.unlink()
    os.mkfifo(manifest)
    refused(saved, capsys, "FIFO")


def test_a_fifo_in_place_of_a_column_file(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    column = next(Path(data_folder(saved)).glob("*-step.bin"))
    column.unlink()
    os.mkfifo(column)
    refused(saved, capsys, "FIFO")


def test_a_column_file_symlinked_outside_the_checkpoint(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same bytes, so every size and checksum matches: only the symlink is wrong, and it is not followed."""
    column = next(Path(data_folder(saved)).glob("*-state.bin"))
    outside = saved.parent.parent / "outside.bin"
    shutil.move(column, outside)
    column.symlink_to(outside)
    refused(saved, capsys, "symbolic link")


def test_the_data_folder_symlinked_outside_the_checkpoint(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(data_folder(saved))
    outside = saved.parent.parent / "elsewhere"
    shutil.move(folder, outside)
    folder.symlink_to(outside, target_is_directory=True)
    refused(saved, capsys, "symbolic link")


def test_the_manifest_symlinked_outside_the_checkpoint(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = Path(data_folder(saved), "manifest.json")
    outside = saved.parent.parent / "manifest.json"
    shutil.move(manifest, outside)
    manifest.symlink_to(outside)
    refused(saved, capsys, "symbolic link")


def test_the_untouched_checkpoint_loads(saved: Path, empty: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline every test above damages: it loads, and the CLI says OK."""
    for path in (saved, empty):
        with ReplayBuffer.from_checkpoint(path) as rb:
            assert len(rb) == (8 if path == saved else 0)
        assert cli.main(["verify", str(path)]) == 0 and cli.main(["inspect", str(path)]) == 0
