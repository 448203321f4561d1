"""checkpoint: atomic writes and the ``<path>.metadata`` file, including hostile and broken files."""

from __future__ import annotations

import os
import pathlib
import pickle
from collections.abc import Callable
from typing import Any, BinaryIO

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.io import atomic_write
from objectrl_buffer.checkpoint.metadata import (
    FORMAT,
    FORMAT_VERSION,
    check_ring,
    load_metadata,
    metadata_path,
    save_metadata,
)
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, EmptyBufferError
from tests.support import fill

Factory = Callable[..., ReplayBuffer]

GOOD = {"buffer_size": 10, "data_size": 10, "pointer": 5}


def _touch(path: str) -> None:
    pathlib.Path(path).touch()


class Payload:
    """Unpickling this runs ``_touch(marker)``: the classic pickle code-execution trick."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _touch, (self.marker,)


def test_metadata_path_for_str_and_pathlike(tmp_path: pathlib.Path) -> None:
    assert metadata_path("a/b") == "a/b.metadata"
    assert metadata_path(tmp_path / "b") == str(tmp_path / "b") + ".metadata"


def test_save_and_load_round_trip(tmp_path: pathlib.Path) -> None:
    target = save_metadata(tmp_path / "b", GOOD)
    assert target == str(tmp_path / "b.metadata")
    assert os.listdir(tmp_path) == ["b.metadata"]
    raw = torch.load(target, weights_only=True)
    assert raw == {**GOOD, "format": FORMAT, "format_version": FORMAT_VERSION, "metadata_crc32": raw["metadata_crc32"]}
    assert load_metadata(str(tmp_path / "b")) == raw


def test_atomic_write_leaves_no_temp_files(tmp_path: pathlib.Path) -> None:
    for i in range(5):
        atomic_write(str(tmp_path / "f"), lambda f, i=i: f.write(bytes([i]) * 10))
    assert os.listdir(tmp_path) == ["f"]
    assert (tmp_path / "f").read_bytes() == bytes([4]) * 10


def test_atomic_write_failure_keeps_the_old_file(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def fail(f: BinaryIO) -> None:
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match=r"f'.*No space left") as info:
        atomic_write(str(target), fail)
    assert isinstance(info.value.__cause__, OSError)
    assert str(target) in str(info.value)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_atomic_write_cleans_up_after_any_exception(tmp_path: pathlib.Path) -> None:
    def fail(f: BinaryIO) -> None:
        f.write(b"partial")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        atomic_write(str(tmp_path / "f"), fail)
    assert os.listdir(tmp_path) == []


def test_atomic_write_into_a_missing_folder_names_the_path(tmp_path: pathlib.Path) -> None:
    target = str(tmp_path / "missing" / "f")
    with pytest.raises(CheckpointError, match="missing/f") as info:
        atomic_write(target, lambda f: None)
    assert isinstance(info.value.__cause__, OSError)


def test_missing_metadata(tmp_path: pathlib.Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"nothing\.metadata") as info:
        load_metadata(tmp_path / "nothing")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, CheckpointError)


def test_a_folder_is_not_metadata(tmp_path: pathlib.Path) -> None:
    (tmp_path / "d.metadata").mkdir()
    with pytest.raises(CheckpointError, match=r"d\.metadata.*folder"):
        load_metadata(tmp_path / "d")


def write_raw(tmp_path: pathlib.Path, data: bytes) -> pathlib.Path:
    (tmp_path / "b.metadata").write_bytes(data)
    return tmp_path / "b"


@pytest.mark.parametrize("cut", [0, 1, 10, 100, 0.5, -20, -1])
def test_truncated_metadata(tmp_path: pathlib.Path, cut: float) -> None:
    save_metadata(tmp_path / "b", GOOD)
    data = (tmp_path / "b.metadata").read_bytes()
    end = int(len(data) * cut) if isinstance(cut, float) else cut
    path = write_raw(tmp_path, data[:end])
    with pytest.raises(CheckpointError, match=r"b\.metadata.*not a readable metadata file"):
        load_metadata(path)


@pytest.mark.parametrize("payload", [b"garbage" * 20, b"\x80\x02}q\x00.", b"PK\x03\x04" + b"\x00" * 64])
def test_garbage_metadata(tmp_path: pathlib.Path, payload: bytes) -> None:
    with pytest.raises(CheckpointError, match=r"b\.metadata"):
        load_metadata(write_raw(tmp_path, payload))


def test_plain_pickle_is_refused(tmp_path: pathlib.Path) -> None:
    path = write_raw(tmp_path, pickle.dumps(GOOD, protocol=2))
    with pytest.raises(CheckpointError, match=r"b\.metadata"):
        load_metadata(path)


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_pickled_object_is_refused_without_running_it(tmp_path: pathlib.Path, writer: str) -> None:
    marker = tmp_path / "pwned"
    payload = {**GOOD, "extra": Payload(str(marker))}
    if writer == "torch.save":
        torch.save(payload, str(tmp_path / "b.metadata"))
    else:
        (tmp_path / "b.metadata").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(CheckpointError, match=r"b\.metadata.*(unsafe|not a readable)"):
        load_metadata(tmp_path / "b")
    assert not marker.exists()
    # the payload is live: an unsafe load would have run it
    torch.load(str(tmp_path / "b.metadata"), weights_only=False) if writer == "torch.save" else pickle.loads(
        (tmp_path / "b.metadata").read_bytes()
    )
    assert marker.exists()


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ([1, 2, 3], "holds a list"),
        (torch.zeros(3), "holds a Tensor"),
        ({**GOOD, "format_version": FORMAT_VERSION + 1}, f"format version {FORMAT_VERSION + 1}"),
        ({**GOOD, "format_version": "1"}, "format version"),
        ({"data_size": 3, "pointer": 3}, "lacks the key 'buffer_size'"),
        ({"buffer_size": 10, "pointer": 3}, "lacks the key 'data_size'"),
        ({"buffer_size": 10, "data_size": 3}, "lacks the key 'pointer'"),
        ({**GOOD, "buffer_size": torch.tensor(10)}, "must be ints"),
        ({**GOOD, "pointer": 5.0}, "must be ints"),
        ({**GOOD, "data_size": True}, "must be ints"),
        ({"buffer_size": 0, "data_size": 0, "pointer": 0}, "inconsistent"),
        ({"buffer_size": 10, "data_size": 11, "pointer": 1}, "inconsistent"),
        ({"buffer_size": 10, "data_size": -1, "pointer": 0}, "inconsistent"),
        ({"buffer_size": 10, "data_size": 10, "pointer": 10}, "inconsistent"),
        ({"buffer_size": 10, "data_size": 10, "pointer": -1}, "inconsistent"),
        ({"buffer_size": 10, "data_size": 4, "pointer": 2}, "inconsistent"),
    ],
)
def test_bad_metadata_contents(tmp_path: pathlib.Path, payload: Any, match: str) -> None:
    torch.save(payload, str(tmp_path / "b.metadata"))
    with pytest.raises(CheckpointError, match=match) as info:
        load_metadata(tmp_path / "b")
    assert str(tmp_path / "b.metadata") in str(info.value)


def test_upstream_file_without_format_keys_loads(tmp_path: pathlib.Path) -> None:
    torch.save({"buffer_size": 10, "data_size": 4, "pointer": 4}, str(tmp_path / "b.metadata"))
    assert load_metadata(tmp_path / "b")["data_size"] == 4


@pytest.mark.parametrize(("capacity", "size", "pointer"), [(1, 0, 0), (1, 1, 0), (5, 3, 3), (5, 5, 0), (5, 5, 4)])
def test_check_ring_accepts_consistent_states(capacity: int, size: int, pointer: int) -> None:
    meta = {"buffer_size": capacity, "data_size": size, "pointer": pointer}
    assert check_ring(meta, "here") == (capacity, size, pointer)


# ---------------------------------------------------------------- through ReplayBuffer.save / load
@pytest.mark.parametrize("as_path", [str, pathlib.Path], ids=["str", "Path"])
def test_save_writes_exactly_path_dot_metadata(wrapped: ReplayBuffer, tmp_path: pathlib.Path, as_path: type) -> None:
    target = tmp_path / "ckpt" / "buffer"
    target.parent.mkdir()
    wrapped.save(as_path(target))
    assert os.listdir(target.parent) == ["buffer.metadata"]
    meta = torch.load(str(target) + ".metadata", weights_only=True)
    assert isinstance(meta, dict)
    assert {k: meta[k] for k in ("buffer_size", "data_size", "pointer")} == {
        "buffer_size": 10,
        "data_size": 10,
        "pointer": 5,
    }
    assert all(type(meta[k]) is int for k in ("buffer_size", "data_size", "pointer"))


@pytest.mark.parametrize("as_path", [str, pathlib.Path], ids=["str", "Path"])
def test_load_restores_the_counters(
    wrapped: ReplayBuffer, make_buffer: Factory, tmp_path: pathlib.Path, as_path: type
) -> None:
    wrapped.save(as_path(tmp_path / "b"))
    fresh = make_buffer(10)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        fresh.load(as_path(tmp_path / "b"))
    assert (fresh.buffer_size, fresh.data_size, fresh.pointer, len(fresh)) == (10, 10, 5, 10)
    other_size = make_buffer(3)  # holds no data: adopts the saved capacity
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        other_size.load(tmp_path / "b")
    assert (other_size.buffer_size, other_size.data_size, other_size.pointer) == (10, 10, 5)


def test_load_of_metadata_only_then_sampling_says_no_data(
    wrapped: ReplayBuffer, make_buffer: Factory, tmp_path: pathlib.Path
) -> None:
    wrapped.save(tmp_path / "b")
    fresh = make_buffer(10)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        fresh.load(tmp_path / "b")
    with pytest.raises(EmptyBufferError, match="no data"):
        fresh.sample_batch(4)


def test_save_overwrites_and_load_reads_the_latest(
    rb: ReplayBuffer, make_buffer: Factory, tmp_path: pathlib.Path
) -> None:
    fill(rb, range(3))
    rb.save(tmp_path / "b")
    fill(rb, range(3, 5))
    rb.save(tmp_path / "b")
    fresh = make_buffer(10)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        fresh.load(tmp_path / "b")
    assert (fresh.data_size, fresh.pointer) == (5, 5)
    assert sorted(os.listdir(tmp_path)) == ["b.metadata", "storage"]


def test_load_reads_a_file_written_like_upstream(make_buffer: Factory, tmp_path: pathlib.Path) -> None:
    torch.save({"buffer_size": 8, "data_size": 8, "pointer": 3}, str(tmp_path / "up") + ".metadata")
    rb = make_buffer(8)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        rb.load(str(tmp_path / "up"))
    assert (rb.buffer_size, rb.data_size, rb.pointer) == (8, 8, 3)


def test_memory_after_a_metadata_only_load_reports_no_rows(tmp_path) -> None:
    """The torchrl view must not claim rows its storage does not hold (it would raise on sampling)."""
    import torch as _torch

    from objectrl_buffer import ReplayBuffer

    source = ReplayBuffer("cpu", "cpu", 8)
    source.add_batch({"x": _torch.arange(5.0)})
    source.save(tmp_path / "meta")
    fresh = ReplayBuffer("cpu", "cpu", 8)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        fresh.load(tmp_path / "meta")
    assert len(fresh) == 5
    assert len(fresh.memory) == 0
    source.close()
    fresh.close()
