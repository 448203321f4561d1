"""A damaged ``.metadata`` file is refused (``CheckpointError`` naming it), never read as other data.

The file carries ``metadata_crc32``: the crc32 of its other entries, so that a flipped bit in the key
that names the data folder can no longer turn a full checkpoint into a metadata-only one.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import open_checkpoint
from objectrl_buffer.checkpoint.metadata import load_metadata
from objectrl_buffer.cli import commands as cli
from objectrl_buffer.errors import CheckpointError
from tests.support import assert_same, fill_rows, full_snapshot, signed

RING = ("buffer_size", "data_size", "pointer")


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A full checkpoint at ``<tmp>/run`` (capacity 8, 13 rows added: wrapped)."""
    rb = ReplayBuffer("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.save(tmp_path / "run", data=True)
    rb.close()
    return tmp_path / "run"


def flipped(good: bytes, i: int, bit: int) -> bytes:
    damaged = bytearray(good)
    damaged[i] ^= 1 << bit
    return bytes(damaged)


def test_the_metadata_records_its_own_crc32_as_documented(saved: Path) -> None:
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    assert type(meta["metadata_crc32"]) is int and signed(meta) == meta
    assert all(type(meta[k]) is int for k in RING)  # still what ObjectRL reads


def test_a_flip_in_the_data_dir_key_is_refused_not_loaded_as_counters(saved: Path, tmp_path: Path) -> None:
    """The campaign's finding: ``data_dir`` -> ``data_dis`` made a full checkpoint metadata-only."""
    meta_file = Path(f"{saved}.metadata")
    good = meta_file.read_bytes()
    at = good.index(b"data_dir")
    meta_file.write_bytes(good[: at + 7] + b"s" + good[at + 8 :])  # 'r' (0x72) -> 's' (0x73): one bit
    target = ReplayBuffer("cpu", "cpu", 8, seed=5, storage_dir=tmp_path / "storage")
    fill_rows(target, 3, first=500)
    before = full_snapshot(target)
    with pytest.raises(CheckpointError, match="metadata") as info:
        target.load(saved)
    assert str(saved) in str(info.value)
    assert_same(full_snapshot(target), before)
    assert cli.main(["verify", str(saved)]) == 1
    target.close()


def pickle_bytes(good: bytes) -> range:
    """Where the entries are: the contents of the zip record ``archive/data.pkl`` that torch.save wrote."""
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    at = info.header_offset
    start = (
        at + 30 + int.from_bytes(good[at + 26 : at + 28], "little") + int.from_bytes(good[at + 28 : at + 30], "little")
    )
    return range(start, start + info.compress_size)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # torch, on a flipped protocol byte
def test_every_bit_flip_is_refused_or_harmless(saved: Path) -> None:
    """Every byte of the entries (two bits each), every 5th byte of the zip around them (one bit): either a
    CheckpointError naming the file or exactly the original entries (a flip in zip padding that torch does
    not read, or in the checksum's own key name), never other values and never another exception."""
    meta_file = Path(f"{saved}.metadata")
    good = meta_file.read_bytes()
    original = load_metadata(saved)
    expected = {k: v for k, v in original.items() if k != "metadata_crc32"}
    entries = pickle_bytes(good)
    flips = [(i, bit) for i in entries for bit in (i % 8, (i + 3) % 8)]
    flips += [(i, i % 8) for i in range(0, len(good), 5) if i not in entries]
    refused = 0
    for i, bit in flips:
        meta_file.write_bytes(flipped(good, i, bit))
        try:
            got: dict[str, Any] = load_metadata(saved)
        except CheckpointError as exc:
            assert str(saved) in str(exc), exc
            refused += i in entries
            continue
        assert {k: got.get(k) for k in expected} == expected, f"byte {i} bit {bit}: {got}"
    assert refused > len(entries)  # most flips in the entries are refused (not all: e.g. in an unused memo index)


def test_sampled_bit_flips_through_load_and_the_cli(saved: Path, tmp_path: Path) -> None:
    """Every 7th byte of the entries: load is refused with the buffer unchanged (and verify and inspect exit 1),
    or it loads exactly the original checkpoint."""
    meta_file = Path(f"{saved}.metadata")
    good = meta_file.read_bytes()
    reference = ReplayBuffer.from_checkpoint(saved, storage_dir=tmp_path / "storage")
    expected = full_snapshot(reference)
    target = ReplayBuffer("cpu", "cpu", 8, seed=5, storage_dir=tmp_path / "storage")
    fill_rows(target, 3, first=500)
    untouched = full_snapshot(target)
    for i in pickle_bytes(good)[::7]:
        meta_file.write_bytes(flipped(good, i, i % 8))
        try:
            open_checkpoint(saved)
        except CheckpointError:
            with pytest.raises(CheckpointError):
                target.load(saved)
            assert_same(full_snapshot(target), untouched, f"byte {i}")
            assert cli.main(["verify", str(saved)]) == 1
            assert cli.main(["inspect", str(saved)]) == 1
            continue
        loaded = ReplayBuffer("cpu", "cpu", 8, seed=5, storage_dir=tmp_path / "storage")
        loaded.load(saved)
        assert_same(full_snapshot(loaded), expected, f"byte {i}")
        loaded.close()
    target.close()
    reference.close()


def test_a_metadata_file_without_the_checksum_still_loads(saved: Path) -> None:
    """Files from before the checksum (and ObjectRL's own) have none: they load as they always did."""
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    del meta["metadata_crc32"]
    torch.save(meta, f"{saved}.metadata")
    rb = ReplayBuffer.from_checkpoint(saved)
    assert (rb.buffer_size, len(rb), rb.pointer) == (8, 8, 5)
    rb.close()


def test_a_wrong_checksum_is_refused_and_verify_says_so(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    torch.save({**meta, "pointer": 4, "data_size": 4}, f"{saved}.metadata")  # consistent ring, stale checksum
    with pytest.raises(CheckpointError, match=r"run\.metadata.*crc32"):
        load_metadata(saved)
    assert cli.main(["verify", str(saved)]) == 1
    err = capsys.readouterr().err
    assert "crc32" in err and len(err.strip().splitlines()) == 1


def test_a_checksum_of_the_wrong_type_is_refused(saved: Path) -> None:
    meta = torch.load(f"{saved}.metadata", weights_only=True)
    for bad in ("1234", 1.5, -1, 2**32, True):
        torch.save({**meta, "metadata_crc32": bad}, f"{saved}.metadata")
        with pytest.raises(CheckpointError, match=r"run\.metadata.*metadata_crc32"):
            load_metadata(saved)
    rest = {k: v for k, v in meta.items() if k != "metadata_crc32"}
    torch.save({**rest, "metadata_crc32": zlib.crc32(b"something else")}, f"{saved}.metadata")
    with pytest.raises(CheckpointError, match=r"run\.metadata"):
        load_metadata(saved)
