"""Hostile files in task checkpoints and shared-storage folders: a link or special file is refused (never
followed, never waited on), and forged contents raise CheckpointError naming the file: no raw KeyError,
RecursionError, torch RuntimeError or MemoryError, nothing allocated beyond the file's size, no hang."""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer.errors import CheckpointError
from objectrl_buffer.tasks import InMemoryStorage, SharedTaskStorage, TaskReplayBuffer
from tests.tasks.workers import step_row

DEEP = "[" * 100_000 + "]" * 100_000


def row_bytes(state: Any = None, meta: dict[str, Any] | None = None, text: str | None = None) -> bytes:
    """One encoded row (u32 header length, JSON header, tensor bytes) whose header we choose."""
    if text is None:
        header = {
            "id": "r",
            "meta": {"task_id": "t", "task_name": "n", "agent_id": "a", "step": 0, "execute_time": 0.0} | (meta or {}),
            "data": {"state": state, "actions": None, "reward_t": None, "adv_t": None, "v_t": None, "messages": None},
        }
        text = json.dumps(header)
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw + b"\0" * 16


HOSTILE_ROWS = {
    "deep JSON header": row_bytes(text=DEEP),
    "deep JSON payload": row_bytes(text='{"id":"r","meta":{},"data":{"state":' + DEEP + "}}"),
    "negative shape": row_bytes({"$tensor": [0, "float32", [-4, 1]]}),
    "huge shape": row_bytes({"$tensor": [0, "uint8", [2**40, 2**40]]}),
    "huge zero shape": row_bytes({"$tensor": [0, "uint8", [2**62, 2**62, 0]]}),
    "shape of strings": row_bytes({"$tensor": [0, "float32", ["2"]]}),
    "short tensor marker": row_bytes({"$tensor": [0, "float32"]}),
    "not a dtype": row_bytes({"$tensor": [0, "Tensor", [1]]}),
    "quantized dtype": row_bytes({"$tensor": [0, "qint8", [1]]}),
    "missing meta field": row_bytes(text='{"id":"r","meta":{"task_id":"t"},"data":{}}'),
    "unknown meta field": row_bytes(meta={"spy": 1}),
    "task_id not a str": row_bytes(meta={"task_id": 7}),
    "step NaN": row_bytes(meta={"step": float("nan")}),
    "header not a dict": row_bytes(text="[1, 2]"),
    "header past the row": struct.pack("<I", 2**31) + b"{}",
}


# ---------------------------------------------------------------- checkpoints (TaskReplayBuffer.save/load)
def forge(folder: Path, encoded: list[bytes] | None = None, vocab: Any = None, **manifest: Any) -> None:
    """Rewrite the checkpoint at ``folder`` with these files (crc32 and sizes right: only the contents lie)."""
    old = json.loads((folder / "manifest.json").read_text())
    rows = encoded or []
    blobs = {
        "rows": b"".join(rows),
        "lengths": struct.pack(f"<{len(rows)}q", *map(len, rows)),
        "vocab": json.dumps(vocab if vocab is not None else {}).encode(),
    }
    files = {}
    for kind, payload in blobs.items() if encoded is not None or vocab is not None else ():
        name = f"{kind}.forged00.bin"
        (folder / name).write_bytes(payload)
        files[kind] = {"name": name, "bytes": len(payload), "crc32": zlib.crc32(payload)}
    old["files"] = files or old["files"]
    if encoded is not None:
        old["rows"] = len(rows)
    (folder / "manifest.json").write_text(json.dumps(old | manifest))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=50))
    rb.store_batch([step_row(0, 0, s) for s in range(3)])
    rb.save(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def assert_refused(folder: Path, match: str | None = None) -> None:
    target = TaskReplayBuffer(InMemoryStorage(max_capacity=50))
    target.store(step_row(5, 5, 5))
    before = [r.id for r in target.storage.get_all()]
    with pytest.raises(CheckpointError, match=match) as info:
        target.load(folder)
    assert str(folder) in str(info.value)
    assert [r.id for r in target.storage.get_all()] == before


@pytest.mark.parametrize("case", sorted(HOSTILE_ROWS))
def test_checkpoint_with_a_hostile_row(checkpoint: Path, case: str) -> None:
    forge(checkpoint, [HOSTILE_ROWS[case]], vocab={n: [] for n in ("task_id", "task_name", "agent_id", "pre_agent")})
    assert_refused(checkpoint)


VOCAB = {"task_id": [], "task_name": [], "agent_id": [], "pre_agent": []}


@pytest.mark.parametrize(
    "manifest",
    [
        {"files": []},
        {"files": {"rows": "x"}},
        {"files": {"rows": {"name": "a\0b", "bytes": 1, "crc32": 0}}},
        {"files": {"rows": {"name": "../manifest.json", "bytes": 1, "crc32": 0}}},
        {"max_capacity": "many"},
        {"max_capacity": -3},
        {"max_capacity": None},
        {"rows": "3"},
        {"rows": 2**70},
        {"max_capacity": 10**400},
    ],
    ids=repr,
)
def test_checkpoint_with_a_hostile_manifest(checkpoint: Path, manifest: dict[str, Any]) -> None:
    forge(checkpoint, **manifest)
    assert_refused(checkpoint)


@pytest.mark.parametrize("vocab", [[], {"task_id": "abc"}, {"task_id": [1]}, {"task_id": ["t", "t"]}, {}], ids=repr)
def test_checkpoint_with_a_hostile_vocabulary(checkpoint: Path, vocab: Any) -> None:
    forge(checkpoint, [row_bytes()], vocab=vocab)
    assert_refused(checkpoint)


def test_checkpoint_lengths_that_overflow(checkpoint: Path) -> None:
    forge(checkpoint, [row_bytes()], vocab=VOCAB)
    lengths = struct.pack("<3q", 2**62, 2**62, 2**63 - 2**63 + len(row_bytes()))  # int64 sum wraps
    (checkpoint / "lengths.forged00.bin").write_bytes(lengths)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["rows"] = 3
    manifest["files"]["lengths"] |= {"bytes": len(lengths), "crc32": zlib.crc32(lengths)}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    assert_refused(checkpoint)


def test_deep_json_manifest(checkpoint: Path) -> None:
    (checkpoint / "manifest.json").write_text(DEEP)
    assert_refused(checkpoint, "manifest.json")


# ---------------------------------------------------------------- shared folders (SharedTaskStorage)
_RECORD = struct.Struct("<IHHIQQQI")  # the commit record the module docstring describes


def record(kind: int, offset: int, length: int, data: bytes = b"", more: int = 0) -> bytes:
    head = _RECORD.pack(0x4B534154, kind, 0, more, offset, length, 0, zlib.crc32(data))
    return head + struct.pack("<I", zlib.crc32(head))


def _good_row() -> bytes:
    return row_bytes(meta={"task_id": "good"})


def shared_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    storage = SharedTaskStorage(max_capacity=50, path=folder)
    storage.add(step_row(0, 0, 0))
    storage.close()
    return folder


def append_row(folder: Path, payload: bytes, kind: int = 1, length: int | None = None) -> None:
    offset = (folder / "rows.data").stat().st_size
    with open(folder / "rows.data", "ab") as f:
        f.write(payload)
    with open(folder / "rows.index", "ab") as f:
        f.write(record(kind, offset, len(payload) if length is None else length, payload))


@pytest.mark.parametrize("case", sorted(HOSTILE_ROWS))
def test_shared_folder_with_a_hostile_row(tmp_path: Path, case: str) -> None:
    folder = shared_folder(tmp_path)
    storage = SharedTaskStorage(max_capacity=50, path=folder)
    assert len(storage.get_all()) == 1
    append_row(folder, _good_row())  # a good store, then the forged one
    append_row(folder, HOSTILE_ROWS[case])
    for _ in range(2):  # nothing of the new stores applied, so the second read meets the forged row again
        with pytest.raises(CheckpointError, match=r"rows\.data"):
            storage.get_all()


def test_shared_record_declaring_2_to_45_bytes(tmp_path: Path) -> None:
    folder = shared_folder(tmp_path)
    append_row(folder, b"", length=2**45)  # was MemoryError (a 32 TiB read), or an allocation that large
    with pytest.raises(CheckpointError, match="rows"):
        SharedTaskStorage(max_capacity=50, path=folder).get_all()


def test_shared_record_of_an_unknown_kind(tmp_path: Path) -> None:
    folder = shared_folder(tmp_path)
    append_row(folder, row_bytes(), kind=9)
    storage = SharedTaskStorage(max_capacity=50, path=folder)
    with pytest.raises(CheckpointError, match=r"rows\.index"):
        storage.get_all()
    with pytest.raises(CheckpointError, match=r"rows\.index"):
        storage.add(step_row(1, 1, 1))  # a writer does not take it for a clear either


@pytest.mark.parametrize("name", ["rows.data", "rows.index", "tasks.json"])
@pytest.mark.parametrize("existing", [False, True])
def test_shared_folder_refuses_a_symlink(tmp_path: Path, name: str, existing: bool) -> None:
    folder = shared_folder(tmp_path) if existing else tmp_path / "fresh"
    folder.mkdir(exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b'{"max_capacity": 50}' if name == "tasks.json" else b"precious bytes")
    before = victim.read_bytes()
    if existing:
        os.rename(folder / name, tmp_path / "moved")
    os.symlink(victim, folder / name)
    with pytest.raises(CheckpointError, match=name):
        storage = SharedTaskStorage(max_capacity=50, path=folder)
        storage.add(step_row(1, 1, 1))  # the old code truncated the symlink's target here
    assert victim.read_bytes() == before


@pytest.mark.parametrize("name", ["rows.data", "tasks.json"])
def test_shared_folder_refuses_a_fifo_without_blocking(tmp_path: Path, name: str) -> None:
    folder = shared_folder(tmp_path)
    os.unlink(folder / name)
    os.mkfifo(folder / name)
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            SharedTaskStorage(max_capacity=50, path=folder).get_all()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock the old code's open() (a writer appears) so the thread ends
        os.close(os.open(folder / name, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"SharedTaskStorage blocked on the FIFO '{name}'")
    assert isinstance(outcome[0], CheckpointError) and name in str(outcome[0]), outcome


@pytest.mark.parametrize("settings", ["[1, 2]", DEEP, '{"max_capacity": 50', "x" * (2 << 20)], ids=len)
def test_shared_folder_with_hostile_settings(tmp_path: Path, settings: str) -> None:
    folder = shared_folder(tmp_path)
    (folder / "tasks.json").write_text(settings)
    with pytest.raises(CheckpointError, match=r"tasks\.json"):
        SharedTaskStorage(max_capacity=50, path=folder)
