"""Checkpoints of a task table: a folder with the encoded rows, their lengths, the vocabularies and a JSON
manifest (crc32 and size of each file) written last, every file through ``checkpoint.io.atomic_write``.

Files carry a fresh token in their names, so a save over an old checkpoint never touches the files the old
manifest names: a crash leaves the old checkpoint or the new one, and superseded files go after the swap.
Saves of one folder take turns: each holds ``<folder>/manifest.json.lock`` (``lock_file``: an ``flock`` the
kernel releases if the saver dies) from its first file to its cleanup, so no save removes the files of
another, and every save that returns leaves a folder that loads (the last one to take the lock wins).
Loading is JSON and raw bytes only (no pickle), and refuses links and special files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import zlib
from typing import Any, BinaryIO

import numpy as np

from objectrl_buffer.checkpoint.io import atomic_write, read_small_file, read_verified
from objectrl_buffer.core.sync import lock_file
from objectrl_buffer.core.validate import MAX_SIZE
from objectrl_buffer.core.vocab import Vocab
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError

from .codec import decode_row, encode_row
from .rows import META_STRINGS
from .table import TaskTable

__all__ = ["save_table", "load_table"]

FORMAT = "objectrl_buffer.tasks.checkpoint/1"
MANIFEST = "manifest.json"
_MANIFEST_LIMIT = 1 << 20
LOCK = MANIFEST + ".lock"
_KINDS = ("rows", "lengths", "vocab")
# what atomic_write leaves of a saver killed mid-file: "<name>.<8 hex>.tmp"
_TEMP = re.compile(r"(?:manifest\.json|(?:rows|lengths|vocab)\.[0-9a-f]{8}\.bin)\.[0-9a-f]{8}\.tmp")


def save_table(table: TaskTable, path: str | os.PathLike[str], max_capacity: int) -> None:
    """Write ``table`` (rows in order, so FIFO order too, and its vocabularies) to the folder ``path``."""
    folder = os.fspath(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create checkpoint folder '{folder}': {exc.strerror or exc}") from exc
    blobs = [encode_row(r) for r in table.each_row()]
    files = {
        "rows": b"".join(blobs),
        "lengths": np.array([len(b) for b in blobs], dtype="<i8").tobytes(),
        "vocab": json.dumps({n: table.vocabs[n].strings for n in META_STRINGS}).encode(),
    }
    lock = os.path.join(folder, LOCK)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(lock_file(lock))
        except OSError as exc:
            raise CheckpointError(f"cannot save '{folder}': cannot lock '{lock}': {exc.strerror or exc}") from exc
        token = secrets.token_hex(4)
        described: dict[str, dict[str, Any]] = {}
        names = set()
        for kind, payload in files.items():
            name = f"{kind}.{token}.bin"
            names.add(name)
            atomic_write(os.path.join(folder, name), functools.partial(_write, payload=payload))
            described[kind] = {"name": name, "bytes": len(payload), "crc32": zlib.crc32(payload)}
        manifest = {"format": FORMAT, "rows": len(blobs), "max_capacity": max_capacity, "files": described}
        text = json.dumps(manifest, indent=1).encode()
        atomic_write(os.path.join(folder, MANIFEST), functools.partial(_write, payload=text))
        _remove_stale(folder, names)


def _remove_stale(folder: str, keep: set[str]) -> None:
    """Under the save lock: remove the files of older saves and the temp files of killed ones (best effort:
    the new checkpoint is complete already)."""
    try:
        for entry in os.scandir(folder):
            old = entry.name.endswith(".bin") and entry.name.split(".")[0] in _KINDS and entry.name not in keep
            if (old or _TEMP.fullmatch(entry.name)) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
    except OSError:
        pass


def _write(f: BinaryIO, payload: bytes) -> None:
    f.write(payload)


def _read(folder: str, kind: str, entry: Any) -> bytes:
    """The bytes of the file the manifest's ``entry`` describes (a regular file inside ``folder``, of the size
    and crc32 it records; read into a buffer of the size the file itself has, never more)."""
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and type(entry.get("bytes")) is int
        and type(entry.get("crc32")) is int
    ):
        raise CheckpointError(f"'{folder}/{MANIFEST}' describes its {kind} file badly: {str(entry)[:200]}")
    name = entry["name"]
    path = os.path.join(folder, name)
    if os.path.basename(name) != name or name in ("", ".", "..") or "\0" in name:
        raise CheckpointError(f"'{folder}/{MANIFEST}' names a file outside the checkpoint: {name!r}")
    return bytes(read_verified(path, "checkpoint file", nbytes=entry["bytes"], crc32=entry["crc32"]))


def _count(manifest: dict[str, Any], key: str, where: str, low: int) -> int:
    value = manifest.get(key)
    if type(value) is not int or not low <= value <= MAX_SIZE:
        raise CheckpointError(f"'{where}' records {key}={str(value)[:80]}, expected an int in [{low}, 2**62]")
    return value


def load_table(path: str | os.PathLike[str]) -> tuple[TaskTable, int]:
    """The table saved at ``path`` and the capacity it was saved with (every file verified first).

    Raises:
        CheckpointNotFoundError: the manifest or a file it names is missing.
        CheckpointError: naming the checkpoint or the file, for anything else wrong with them: a link or a
            special file, a size or crc32 that differs from the manifest, malformed or forged contents.
    """
    folder = os.fspath(path)
    where = os.path.join(folder, MANIFEST)
    try:
        manifest = json.loads(read_small_file(where, _MANIFEST_LIMIT))
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no task buffer checkpoint at '{folder}' ({MANIFEST} is missing)") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"'{where}' is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"'{where}' is not a task buffer checkpoint (format {FORMAT})")
    count = _count(manifest, "rows", where, 0)
    capacity = _count(manifest, "max_capacity", where, 1)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"'{where}' has no 'files' dict")
    rows, lengths, vocab = (_read(folder, k, files.get(k)) for k in _KINDS)
    try:
        sizes = np.frombuffer(lengths, dtype="<i8").tolist()
        if len(sizes) != count or any(n < 0 for n in sizes) or sum(sizes) != len(rows):
            raise ValueError("row lengths do not add up to the rows file")
        vocabs = json.loads(vocab)
        if not isinstance(vocabs, dict):
            raise ValueError("the vocabulary file does not hold a dict")
        table = TaskTable()
        table.vocabs = {n: Vocab(_strings(vocabs.get(n), n)) for n in META_STRINGS}
        view = memoryview(rows)
        decoded, start = [], 0
        for size in sizes:
            decoded.append(decode_row(view[start : start + size]))
            start += size
        stored, values = TaskTable.prepare_compact(decoded)
        table.append(stored, values)
    except (ValueError, TypeError, RecursionError) as exc:  # InvalidArgumentError is a ValueError too
        raise CheckpointError(f"checkpoint '{folder}' is malformed: {str(exc)[:300]}") from exc
    table.note_appended([str(v[0]) for v in values])
    return table, capacity


def _strings(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"the vocabulary of {name} is a {type(value).__name__}, not a list")
    return value
