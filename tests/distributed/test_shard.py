"""A shard without Ray: the wire format of its draw (:func:`pack` / :func:`unpack`) and batches read from a
same-node writer's files."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.shard import Shard
from objectrl_buffer.distributed.wire import MISSING, SharedRows, column_path, pack, unpack, writer_prefix
from tests.support import rows

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.float16]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 9),
    spec=st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(1, 3), max_size=2)), min_size=1, max_size=5),
    mass=st.floats(0, 1e9),
)
def test_pack_round_trips_columns(rows: int, spec: list[tuple[type, list[int]]], mass: float) -> None:
    rng = np.random.default_rng(0)
    columns = {
        f"k{i}.x" if i % 2 else f"k{i}": (rng.random((rows, *shape)) * 100).astype(dtype)
        for i, (dtype, shape) in enumerate(spec)
    }
    packed = pack(mass, columns)
    assert isinstance(packed, bytes)
    got_mass, got_rows, got = unpack(packed)
    assert (got_mass, got_rows) == (mass, rows)
    assert list(got) == list(columns)
    for key, value in columns.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape
        assert np.array_equal(got[key], value)
        assert got[key].flags.writeable  # a copy the caller owns: torch.from_numpy takes it as it is
    _, _, views = unpack(packed, copy=False)
    assert all(np.array_equal(views[k], v) for k, v in columns.items())


def test_pack_of_nothing_and_of_strided_columns() -> None:
    assert unpack(pack(0.0, {})) == (0.0, 0, {})
    wide = np.arange(24, dtype=np.float32).reshape(4, 6)
    _, _, got = unpack(pack(1.0, {"a": wide[:, ::2]}))  # a strided view travels as its values
    assert np.array_equal(got["a"], wide[:, ::2])


def test_unpack_refuses_bytes_that_do_not_match_their_header() -> None:
    packed = pack(1.0, {"a": np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError, match="packed draw"):
        unpack(packed[:-4])


def test_shared_rows_are_stored_once_and_missing_files_refuse_until_resent(tmp_path: Any, monkeypatch: Any) -> None:
    """A shard reads a same-node writer's batch from its files (no Ray needed): stored as the same rows sent
    as a payload would be, once per ``(writer, seq)``; a batch whose files it cannot find is refused
    (``MISSING``), and so is every later batch of that writer until the refused one comes again as rows."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # writers make their folders in the temp folder
    shard = Shard(ReplayBuffer, ("cpu", "cpu", 100), {"seed": 0, "storage_dir": str(tmp_path / "s")})
    folder = str(tmp_path / (writer_prefix("", "w") + "x"))  # the folder name a shard accepts from writer "w"
    os.mkdir(folder)
    data = {k: v.numpy() for k, v in rows(0, 8).items()}
    layout = tuple((k, v.dtype.str, v.shape[1:]) for k, v in data.items())
    for j, value in enumerate(data.values()):
        np.memmap(column_path(folder, 0, j), value.dtype, "w+", 0, (10, *value.shape[1:]))[:8] = value
    described = SharedRows(folder, 0, 5, 10, layout)
    assert shard.add_batch(described, "w", 0) == 5
    assert shard.add_batch(described, "w", 0) == 5  # a retry: stored once
    assert shard.add_batch(SharedRows(folder, 1, 3, 10, layout), "w", 1) == MISSING  # no set 1 there
    later = {k: v[5:8] for k, v in data.items()}
    assert shard.add_batch(later, "w", 2) == MISSING  # after the refused one: refused too
    assert shard.add_batch({k: v[:1] for k, v in data.items()}, "other", 0) == 6  # other writers go on
    assert shard.add_batch({k: v[5:8] for k, v in data.items()}, "w", 1) == 9  # the refused one, as rows
    assert shard.add_batch(later, "w", 2) == 12
    stored = shard.buffer.sample_all()
    assert stored["step"].tolist() == [*data["step"][:5], data["step"][0], *data["step"][5:8], *data["step"][5:8]]
    assert shard.transports() == {"mapped": 1, "payload": 3}
    shard.release("w")


def test_a_writer_that_insists_on_shared_files_refuses_every_add_without_them(monkeypatch: Any) -> None:
    """``same_node=True`` with no shard on this node: each add raises, none quietly goes through Ray."""
    import types

    import numpy as np

    from objectrl_buffer.distributed import remote as remote_module
    from objectrl_buffer.distributed import writer as writer_module
    from objectrl_buffer.errors import InvalidArgumentError

    here = types.SimpleNamespace(get_node_id=lambda: "this-node")
    monkeypatch.setattr(writer_module, "_ray", lambda: types.SimpleNamespace(get_runtime_context=lambda: here))
    handle = types.SimpleNamespace(shards=["s0"], num_envs=1, node_ids=lambda: ["another-node"])
    writer = remote_module.Writer(handle, batch_size=8, flush_every_s=100.0, max_in_flight=2, same_node=True)  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(InvalidArgumentError, match="no shard runs on this node"):
            writer.add({"obs": np.zeros(4, np.float32), "reward": 1.0})
    assert writer.folder is None


def test_a_shard_maps_only_its_writers_folders_and_runs_only_listed_calls(tmp_path: Any, monkeypatch: Any) -> None:
    """Security (issue 23): a shared-rows descriptor naming a folder that is not the writer's own (another
    name, or a link to one) is refused and nothing is stored; the files are never written by the shard; and
    ``call``/``get`` run only the listed read methods (no ``save``/``load`` to a caller's path)."""
    from pathlib import Path

    from objectrl_buffer.errors import InvalidArgumentError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # writers make their folders in the temp folder
    shard = Shard(ReplayBuffer, ("cpu", "cpu", 100), {"seed": 0, "storage_dir": str(tmp_path / "s")}, buffer_id="b1")
    data = {k: v.numpy() for k, v in rows(0, 4).items()}
    layout = tuple((k, v.dtype.str, v.shape[1:]) for k, v in data.items())
    own = str(tmp_path / (writer_prefix("b1", "w") + "x"))
    for folder in (own, str(tmp_path / "elsewhere"), str(tmp_path / (writer_prefix("b2", "w") + "x"))):
        os.mkdir(folder)
        for j, value in enumerate(data.values()):
            np.memmap(column_path(folder, 0, j), value.dtype, "w+", 0, (4, *value.shape[1:]))[:] = value
    os.symlink(own, str(tmp_path / (writer_prefix("b1", "w") + "link")))
    for name in ("elsewhere", writer_prefix("b2", "w") + "x", writer_prefix("b1", "w") + "link"):
        with pytest.raises(InvalidArgumentError, match="not one of writer"):
            shard.add_batch(SharedRows(str(tmp_path / name), 0, 4, 4, layout), "w", 0)
    with pytest.raises(InvalidArgumentError, match="not one of writer"):
        shard.add_batch(SharedRows(own, 0, 4, 4, layout), "v", 0)  # another writer's name
    assert len(shard.buffer) == 0
    assert shard.add_batch(SharedRows(own, 0, 4, 4, layout), "w", 0) == 4
    before = [Path(column_path(own, 0, j)).read_bytes() for j in range(len(layout))]
    for column in shard.mapped["w"][(own, 0)][1].values():
        assert not column.flags.writeable  # mapped read-only: the shard cannot write to the writer's files
        with pytest.raises(ValueError, match="read-only"):
            column[:] = 0
    assert [Path(column_path(own, 0, j)).read_bytes() for j in range(len(layout))] == before
    for name in ("save", "load", "add_batch", "reset"):
        with pytest.raises(InvalidArgumentError, match=name):
            shard.call(name, str(tmp_path / "x"))
    with pytest.raises(InvalidArgumentError, match="storage_dir"):
        shard.get("storage_dir")
    assert shard.call("__len__") == 4 and shard.get("buffer_size") == 100
    shard.release("w")
