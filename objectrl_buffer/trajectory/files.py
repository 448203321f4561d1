"""RLinf's buffer folder: one file per trajectory plus ``metadata.json`` and ``trajectory_index.json``.

Layout (RLinf's names and keys, so folders move both ways)::

    trajectory_{id}_{model_weights_id}.pt|pkl   a dict: fields [T, B, ...], dict fields, max_episode_length, ...
    trajectory_index.json                        {"trajectory_index": {"<id>": info}, "trajectory_id_list": [...]}
    metadata.json                                {storage_dir, storage_format, trajectory_format, size,
                                                  total_samples, trajectory_counter, seed}, and a checkpoint
                                                  holding fewer than were added: num_added, kept (a sentence)

A trajectory file holds ``dones``/``terminations``/``truncations`` with the ``T + E`` rows they were added
with (one per epoch start, as RLinf writes them); readers align them with ``rewards``
(:mod:`~objectrl_buffer.trajectory.trajectory`).

``info`` is ``{num_samples, trajectory_id, max_episode_length, shape, model_weights_id}``; the folders written
here add ``bytes`` and ``crc32`` (hex) of the file, checked on every read (RLinf ignores keys it does not know,
and the files themselves stay exactly what ``torch.save`` writes). RLinf's seed-era
buffers call the format key ``storage_format``, 0.3 calls it ``trajectory_format``: both are written, either
is read. Older merge tools wrote the index as ``trajector_index.json``: it is read when the right one is missing.

Every file is written to a temp name and renamed (:func:`~objectrl_buffer.checkpoint.io.atomic_write`), and
the index and metadata are rewritten only after the trajectory files they name exist, so a folder cut short
by a kill at any moment still loads, holding a prefix of what was added. Trajectory files are written
without an fsync each and synced in a batch (:func:`sync_files`) just before an index names them, so the
index is durable only after its files are (a power cut too leaves a folder that loads), with one disk
flush per index instead of two per file.

Reading is hostile-file safe: a trajectory file must be a regular file inside the folder (no symlink, FIFO or
device: :func:`~objectrl_buffer.checkpoint.io.open_regular`), match its entry's size and checksum when the
index records them, and, as a ``.pt`` zip, unpack to no more bytes than the file holds (``torch.save`` never
compresses), checked in the zip's central directory before ``torch.load`` allocates anything. An index
listing an id twice, or an id that is no JSON integer (``true``, ``1.0``, ``"1"``), is refused.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import re
import zipfile
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import torch

from objectrl_buffer.checkpoint.io import (
    atomic_write,
    fsync_path,
    open_checkpoint_file,
    read_small_file,
    read_verified,
)
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from objectrl_buffer.trajectory.trajectory import check_weights_id

__all__ = [
    "METADATA",
    "NUM_ADDED",
    "INDEX",
    "LEGACY_INDEX",
    "FORMATS",
    "Entry",
    "Folder",
    "read_folder",
    "file_name",
    "find_file",
    "load_payload",
    "write_payload",
    "copy_file",
    "sync_files",
    "write_index",
]

METADATA = "metadata.json"
#: Metadata key of a checkpoint holding fewer trajectories than were added: how many were added (ours only).
NUM_ADDED = "num_added"
INDEX = "trajectory_index.json"
LEGACY_INDEX = "trajector_index.json"  # RLinf's merge tool reads (and writes) this misspelling too
FORMATS = ("pt", "pkl")
#: Largest JSON file read (a million trajectories' index is ~200 MB).
JSON_LIMIT = 1 << 30
#: Bytes copied at a time by :func:`copy_file`.
COPY_BLOCK = 1 << 22
_CRC = re.compile(r"^[0-9a-fA-F]{8}$")


@dataclass(frozen=True)
class Entry:
    """One trajectory of an index: RLinf's ``info`` dict, typed."""

    trajectory_id: int
    num_samples: int
    max_episode_length: int
    shape: tuple[int, ...]
    model_weights_id: str
    nbytes: int | None = None  # the file's size and crc32, where the index records them (ours do, RLinf's not)
    crc32: int | None = None
    #: the epoch-first rows of done-like fields given with ``T + E`` rows (``Flat.heads``), written back
    #: into the file; in memory only, never in the index
    heads: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def info(self) -> dict[str, Any]:
        """RLinf's index entry (JSON types), plus ``bytes`` and ``crc32`` where known."""
        info: dict[str, Any] = {
            "num_samples": self.num_samples,
            "trajectory_id": self.trajectory_id,
            "max_episode_length": self.max_episode_length,
            "shape": list(self.shape),
            "model_weights_id": self.model_weights_id,
        }
        if self.nbytes is not None and self.crc32 is not None:
            info["bytes"] = self.nbytes
            info["crc32"] = f"{self.crc32:08x}"
        return info

    def renumbered(self, trajectory_id: int) -> Entry:
        return replace(self, trajectory_id=trajectory_id)

    def with_file(self, nbytes: int, crc32: int) -> Entry:
        """This entry, recording its file's size and checksum (an index entry: no :attr:`heads`)."""
        return replace(self, nbytes=nbytes, crc32=crc32, heads={})


@dataclass
class Folder:
    """What ``metadata.json`` and the index of a folder say."""

    path: str
    metadata: dict[str, Any]
    entries: list[Entry]  # in trajectory_id_list order
    fmt: str

    @property
    def seed(self) -> Any:
        return self.metadata.get("seed")


def file_name(trajectory_id: int, weights_id: str, fmt: str) -> str:
    """RLinf's file name of a trajectory."""
    return f"trajectory_{trajectory_id}_{weights_id}.{fmt}"


def _read_object(path: str, missing: str) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`CheckpointNotFoundError` ``missing`` if there is no such file."""
    try:
        value = json.loads(read_small_file(path, JSON_LIMIT))
    except FileNotFoundError:
        raise CheckpointNotFoundError(missing) from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"'{path}' is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"'{path}' must hold a JSON object")
    return value


def _int(value: Any, what: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"'{path}': {what} must be a non-negative int, got {value!r}")
    return value


def _entry(raw: Any, key: int, path: str) -> Entry:
    if not isinstance(raw, dict):
        raise CheckpointError(f"'{path}': the entry of trajectory {key} is not an object")
    shape = raw.get("shape") or []
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise CheckpointError(f"'{path}': the shape of trajectory {key} is not a list of ints: {shape!r}")
    try:
        weights_id = check_weights_id(raw.get("model_weights_id", ""), f"'{path}', trajectory {key}")
    except InvalidArgumentError as exc:
        raise CheckpointError(str(exc)) from None
    mel = raw.get("max_episode_length", 0)
    nbytes = crc = None
    if "bytes" in raw or "crc32" in raw:
        nbytes = _int(raw.get("bytes"), f"bytes of trajectory {key}", path)
        text = raw.get("crc32")
        if not isinstance(text, str) or not _CRC.match(text):
            raise CheckpointError(f"'{path}': crc32 of trajectory {key} must be 8 hex digits, got {text!r}")
        crc = int(text, 16)
    return Entry(
        trajectory_id=key,
        num_samples=_int(raw.get("num_samples", 0), f"num_samples of trajectory {key}", path),
        max_episode_length=mel if isinstance(mel, int) and not isinstance(mel, bool) else 0,
        shape=tuple(shape),
        model_weights_id=weights_id,
        nbytes=nbytes,
        crc32=crc,
    )


def read_folder(path: str) -> Folder:
    """The metadata and index of an RLinf buffer folder (RLinf's or ours), checked.

    Raises:
        CheckpointNotFoundError: ``metadata.json`` or the index is missing (names the path).
        CheckpointError: either is damaged, or names a trajectory the index does not describe.
    """
    meta_path = os.path.join(path, METADATA)
    metadata = _read_object(meta_path, f"Metadata not found at {meta_path}")
    index_path = os.path.join(path, INDEX)
    if not os.path.exists(index_path) and os.path.exists(os.path.join(path, LEGACY_INDEX)):
        index_path = os.path.join(path, LEGACY_INDEX)
    index = _read_object(index_path, f"Trajectory index not found at {os.path.join(path, INDEX)}")
    infos = index.get("trajectory_index", {})
    ids = index.get("trajectory_id_list", [])
    if not isinstance(infos, dict) or not isinstance(ids, list):
        raise CheckpointError(f"'{index_path}': trajectory_index must be an object and trajectory_id_list a list")
    entries = []
    seen: set[int] = set()
    for raw_id in ids:
        if isinstance(raw_id, bool) or not isinstance(raw_id, int):  # JSON true is no id 1, 1.0 or "1" no id
            raise CheckpointError(f"'{index_path}': trajectory id {raw_id!r} is not a JSON integer")
        key = raw_id
        if key in seen:  # each would load the same file again
            raise CheckpointError(f"'{index_path}': trajectory id {key} is listed more than once")
        seen.add(key)
        raw = infos.get(str(key), infos.get(key))
        if raw is None:
            raise CheckpointError(f"'{index_path}': trajectory {key} is listed but has no entry")
        entries.append(_entry(raw, _int(key, "a trajectory id", index_path), index_path))
    fmt = metadata.get("storage_format", metadata.get("trajectory_format", "pt"))
    if fmt not in FORMATS:
        raise CheckpointError(f"'{meta_path}': unknown trajectory format {fmt!r} (expected 'pt' or 'pkl')")
    return Folder(path, metadata, entries, fmt)


def find_file(folder: str, entry: Entry, fmt: str) -> str | None:
    """The file of ``entry`` in ``folder``: RLinf's exact name, else ``trajectory_{id}_*.{fmt}`` (as RLinf's
    merge tool looks), else ``None``. A name that exists is returned whatever it is (a symlink, a FIFO): the
    reader refuses it, instead of falling back to another file."""
    exact = os.path.join(folder, file_name(entry.trajectory_id, entry.model_weights_id, fmt))
    if os.path.lexists(exact):
        return exact
    found = sorted(glob.glob(os.path.join(glob.escape(folder), f"trajectory_{entry.trajectory_id}_*.{fmt}")))
    return found[0] if found else None


def find_files(folder: Folder) -> list[str]:
    """Every file of ``folder``'s index, or :class:`CheckpointNotFoundError` naming the missing ones."""
    paths, missing = [], []
    for entry in folder.entries:
        path = find_file(folder.path, entry, folder.fmt)
        if path is None:
            missing.append(file_name(entry.trajectory_id, entry.model_weights_id, folder.fmt))
        paths.append(path or "")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointNotFoundError(f"'{folder.path}': {len(missing)} trajectory file(s) missing: {shown}")
    return paths


def _read_file(path: str, entry: Entry | None) -> bytearray:
    """The bytes of the regular file ``path`` (no symlink, FIFO, device), checked against ``entry``'s size
    and checksum where it records them. Allocates the file's own size, no more."""
    if entry is None:
        return read_verified(path, "trajectory file")
    return read_verified(path, "trajectory file", nbytes=entry.nbytes, crc32=entry.crc32)


def _check_archive(path: str, data: bytearray) -> None:
    """Refuse a ``.pt`` that is not a zip, or whose members unpack to more bytes than the file holds (a
    compressed archive: ``torch.save`` never compresses), from its central directory, before torch allocates."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise CheckpointError(f"trajectory file '{path}' is not a torch.save archive: {exc}") from None
    if unpacked > len(data):
        raise CheckpointError(
            f"trajectory file '{path}' unpacks to {unpacked} bytes, more than its own {len(data)}: a compressed "
            "archive (torch.save never compresses) is refused"
        )


def load_payload(path: str, allow_pickle: bool, entry: Entry | None = None) -> Any:
    """The dict a trajectory file holds, read by :func:`_read_file` (checked against ``entry``). ``.pt``
    loads with ``weights_only=True`` once :func:`_check_archive` passed; ``.pkl`` is unpickled only with
    ``allow_pickle=True`` (unpickling runs code from the file).

    Raises:
        CheckpointNotFoundError: no such file. CheckpointError: naming the file: not a regular file, a size or
            checksum that differs from ``entry``, a compressed or damaged archive, pickle without ``allow_pickle``.
    """
    if path.endswith(".pkl"):
        if not allow_pickle:
            raise CheckpointError(
                f"'{path}' is a pickle file: loading it runs code from the file. Pass allow_pickle=True if you trust it"
            )
        data = _read_file(path, entry)
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise CheckpointError(f"cannot read trajectory file '{path}': {exc}") from exc
    data = _read_file(path, entry)
    _check_archive(path, data)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read trajectory file '{path}': {exc}") from exc


class _Summed:
    """A binary file that keeps the crc32 and size of what is written through it."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.crc = 0
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()


def write_payload(path: str, payload: dict[str, Any], fmt: str, *, durable: bool = True) -> tuple[int, int]:
    """Write a trajectory file atomically (temp name, fsync, rename); ``durable=False``: no fsync, the
    caller syncs a batch (:func:`sync_files`) before an index names them. Returns the file's
    ``(bytes, crc32)`` for its index entry."""
    summed: list[_Summed] = []

    def write(f: BinaryIO) -> None:
        out = _Summed(f)
        summed[:] = [out]
        if fmt == "pt":
            torch.save(payload, out)  # type: ignore[arg-type]
        else:
            pickle.dump(payload, out, protocol=pickle.HIGHEST_PROTOCOL)

    atomic_write(path, write, durable=durable)
    return summed[0].size, summed[0].crc


def copy_file(source: str, target: str, entry: Entry) -> Entry:
    """Copy the trajectory file ``source`` (a regular file, checked against ``entry`` where it records a size
    and checksum) to the new file ``target``, fsynced; return ``entry`` recording the copy's size and crc32.

    Raises:
        CheckpointNotFoundError: no ``source``. CheckpointError: ``source`` is a symlink or a special file,
            differs from ``entry``, or cannot be read or written.
    """
    fd = open_checkpoint_file(source, "trajectory file")
    crc = size = 0
    try:
        with os.fdopen(fd, "rb", buffering=0) as f, open(target, "xb") as out:
            while block := f.read(COPY_BLOCK):
                crc = zlib.crc32(block, crc)
                size += len(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise CheckpointError(f"cannot copy trajectory file '{source}' to '{target}': {exc.strerror or exc}") from exc
    if entry.nbytes is not None and entry.crc32 is not None and (size, crc) != (entry.nbytes, entry.crc32):
        raise CheckpointError(
            f"trajectory file '{source}' is damaged: {size} bytes with crc32 {crc:08x}, its index entry says "
            f"{entry.nbytes} bytes with crc32 {entry.crc32:08x}"
        )
    return entry.with_file(size, crc)


def sync_files(folder: str, paths: list[str]) -> None:
    """Make files written with ``durable=False`` durable, and their names in ``folder``: an fsync each,
    then one of the folder. Raises :class:`CheckpointError` naming the file that failed."""
    for path in paths:
        try:
            fsync_path(path)
        except OSError as exc:
            raise CheckpointError(f"cannot sync trajectory file '{path}': {exc.strerror or exc}") from exc
    if paths:
        fsync_path(folder)


def write_index(
    folder: str,
    entries: list[Entry],
    fmt: str,
    seed: Any,
    *,
    legacy: bool = False,
    storage_dir: str | None = None,
    note: dict[str, Any] | None = None,
) -> None:
    """Rewrite the index, then the metadata, of ``folder`` (each atomically) to name exactly ``entries``.

    The index goes first: a kill between the two leaves metadata counting fewer trajectories than the
    index lists, and the loaders here recount from the index. ``legacy`` also writes ``trajector_index.json``;
    ``storage_dir`` is what the metadata names (default: ``folder``); ``note``: more metadata keys (RLinf
    ignores keys it does not know), e.g. :data:`NUM_ADDED` and ``kept`` of a partial checkpoint.
    """
    index = {
        "trajectory_index": {str(e.trajectory_id): e.info() for e in entries},
        "trajectory_id_list": [e.trajectory_id for e in entries],
    }
    for name in (INDEX, LEGACY_INDEX) if legacy else (INDEX,):
        _write_json(os.path.join(folder, name), index)
    metadata = {
        "storage_dir": os.path.abspath(storage_dir or folder),
        "storage_format": fmt,
        "trajectory_format": fmt,
        "size": len(entries),
        "total_samples": sum(e.num_samples for e in entries),
        "trajectory_counter": max((e.trajectory_id for e in entries), default=-1) + 1,
        "seed": seed if isinstance(seed, int) else None,
    }
    for key, value in (note or {}).items():
        metadata.setdefault(key, value)  # never one of RLinf's keys above
    _write_json(os.path.join(folder, METADATA), metadata)


def _write_json(path: str, value: Any) -> None:
    blob = json.dumps(value).encode()

    def write(f: BinaryIO) -> None:
        f.write(blob)

    atomic_write(path, write)
