"""The checkpoint location of a remote buffer without Ray actors (issue 23): a local path or ``file://`` is used
in place, any other fsspec file system gets each shard's save uploaded and downloaded again on a restart, the
journal and manifest go through it, and the launch check's probe tells a location it cannot see."""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.cut import read_journal, read_manifest, write_manifest
from objectrl_buffer.distributed.location import Location, probe
from objectrl_buffer.errors import CheckpointError
from tests.support import rows

pytest.importorskip("ray")  # Shard imports it (resume=True here: never asked whether it restarted)


class _Far(LocalFileSystem):
    """fsspec's local file system under another class and protocol: a non-local store to the buffer."""

    protocol = ("objectrl-unit-far",)


fsspec.register_implementation("objectrl-unit-far", _Far, clobber=True)


def test_a_local_path_and_a_file_uri_are_one_folder_used_in_place(tmp_path: Any) -> None:
    plain, uri = Location(str(tmp_path / "c")), Location(f"file://{tmp_path / 'c'}")
    assert plain.local and uri.local and plain.root == uri.root == str(tmp_path / "c")
    with uri.saving("gen-000000000001/shard-0") as path:  # no temp folder: the save goes straight there
        assert path == str(tmp_path / "c" / "gen-000000000001" / "shard-0")


def test_an_unknown_protocol_is_a_checkpoint_error_naming_it() -> None:
    with pytest.raises(CheckpointError, match="nosuchfs://x"):
        Location("nosuchfs://x")


def test_a_non_local_store_gets_saves_uploaded_and_a_restart_downloads_them(tmp_path: Any) -> None:
    """A shard's cut is uploaded to the store (temp folder, ``fs.put``), its journal is rewritten there, and a
    new shard (a restart) downloads the cut and counts the rows acknowledged after it as lost."""
    from objectrl_buffer.distributed.shard import Shard

    far = Location(f"objectrl-unit-far://{tmp_path / 'far'}")
    assert not far.local

    def start(life: int) -> Shard:
        kwargs = {"seed": 0, "storage_dir": str(tmp_path / f"life-{life}")}
        return Shard(ReplayBuffer, ("cpu", "cpu", 100), kwargs, 0, far, resume=True)

    shard = start(1)
    shard.add_batch({k: v.numpy() for k, v in rows(0, 10).items()}, "w", 0)
    assert shard.checkpoint(1) == 10
    write_manifest(far, {"generation": 1, "rows": [10], "limiter": {}, "kept": [1], "time": 0.0})
    shard.commit(1)
    shard.add_batch({k: v.numpy() for k, v in rows(10, 3).items()}, "w", 1)
    saved = os.listdir(tmp_path / "far" / "gen-000000000001")
    assert any(name.startswith("shard-0.") for name in saved)  # uploaded
    assert [line.rows for line in read_journal(far, 0)] == [3]  # the write after the cut only
    assert read_manifest(far)["generation"] == 1  # type: ignore[index]
    again = start(2)
    assert len(again.buffer) == 10 and again.lost == 3


def test_the_probe_names_what_an_actor_cannot_see(tmp_path: Any) -> None:
    here = Location(str(tmp_path / "c"))
    assert probe(here, (".probe-a", "t1"), {}) == []
    assert probe(here, None, {".probe-a": "t1"}, cleanup=(".probe-a",)) == []
    assert not os.path.exists(tmp_path / "c" / ".probe-a")  # removed
    assert probe(here, None, {".probe-a": "t1"}) == ["does not see '.probe-a'"]
    probe(here, (".probe-b", "t2"), {})
    assert probe(here, None, {".probe-b": "other"}) == ["sees another '.probe-b' (not the one just written)"]
