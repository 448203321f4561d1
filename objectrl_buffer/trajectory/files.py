"""RLinf's buffer folder: one file per trajectory plus ``metadata.json`` and ``trajectory_index.json``.

Layout (RLinf's names and keys, so folders move both ways)::

    trajectory_{id}_{model_weights_id}.pt|pkl   a dict: fields [T, B, ...], dict fields, max_episode_length, ...
    trajectory_index.json                        {"trajectory_index": {"<id>": info}, "trajectory_id_list": [...]}
    metadata.json                                {storage_dir, storage_format, trajectory_format, size,
                                                  total_samples, trajectory_counter, seed}

``info`` is ``{num_samples, trajectory_id, max_episode_length, shape, model_weights_id}``. RLinf's seed-era
buffers call the format key ``storage_format``, 0.3 calls it ``trajectory_format``: both are written, either
is read. Older merge tools wrote the index as ``trajector_index.json``: it is read when the right one is missing.

Every file is written to a temp name and renamed (:func:`~objectrl_buffer.checkpoint.io.atomic_write`), and
the index and metadata are rewritten only after the trajectory files they name exist, so a folder cut short
by a kill at any moment still loads, holding a prefix of what was added. Trajectory files are written
without an fsync each and synced in a batch (:func:`sync_files`) just before an index names them, so the
index is durable only after its files are (a power cut too leaves a folder that loads), with one disk
flush per index instead of two per file.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from objectrl_buffer.checkpoint.io import atomic_write, fsync_path, read_small_file
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from objectrl_buffer.trajectory.trajectory import check_weights_id

__all__ = [
    "METADATA",
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
    "sync_files",
    "write_index",
]

METADATA = "metadata.json"
INDEX = "trajectory_index.json"
LEGACY_INDEX = "trajector_index.json"  # RLinf's merge tool reads (and writes) this misspelling too
FORMATS = ("pt", "pkl")
#: Largest JSON file read (a million trajectories' index is ~200 MB).
JSON_LIMIT = 1 << 30


@dataclass(frozen=True)
class Entry:
    """One trajectory of an index: RLinf's ``info`` dict, typed."""

    trajectory_id: int
    num_samples: int
    max_episode_length: int
    shape: tuple[int, ...]
    model_weights_id: str

    def info(self) -> dict[str, Any]:
        """RLinf's index entry (JSON types)."""
        return {
            "num_samples": self.num_samples,
            "trajectory_id": self.trajectory_id,
            "max_episode_length": self.max_episode_length,
            "shape": list(self.shape),
            "model_weights_id": self.model_weights_id,
        }

    def renumbered(self, trajectory_id: int) -> Entry:
        return Entry(trajectory_id, self.num_samples, self.max_episode_length, self.shape, self.model_weights_id)


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
    return Entry(
        trajectory_id=key,
        num_samples=_int(raw.get("num_samples", 0), f"num_samples of trajectory {key}", path),
        max_episode_length=mel if isinstance(mel, int) and not isinstance(mel, bool) else 0,
        shape=tuple(shape),
        model_weights_id=weights_id,
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
    for raw_id in ids:
        try:
            key = int(raw_id)
        except (TypeError, ValueError):
            raise CheckpointError(f"'{index_path}': trajectory id {raw_id!r} is not an int") from None
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
    merge tool looks), else ``None``."""
    exact = os.path.join(folder, file_name(entry.trajectory_id, entry.model_weights_id, fmt))
    if os.path.isfile(exact):
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


def load_payload(path: str, allow_pickle: bool) -> Any:
    """The dict a trajectory file holds. ``.pt`` loads with ``weights_only=True``; ``.pkl`` is unpickled
    only with ``allow_pickle=True`` (unpickling runs code from the file)."""
    if path.endswith(".pkl"):
        if not allow_pickle:
            raise CheckpointError(
                f"'{path}' is a pickle file: loading it runs code from the file. Pass allow_pickle=True if you trust it"
            )
        with open(path, "rb") as f:
            try:
                return pickle.load(f)
            except Exception as exc:
                raise CheckpointError(f"cannot read trajectory file '{path}': {exc}") from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read trajectory file '{path}': {exc}") from exc


def write_payload(path: str, payload: dict[str, Any], fmt: str, *, durable: bool = True) -> None:
    """Write a trajectory file atomically (temp name, fsync, rename); ``durable=False``: no fsync, the
    caller syncs a batch (:func:`sync_files`) before an index names them."""
    if fmt == "pt":
        atomic_write(path, lambda f: torch.save(payload, f), durable=durable)
    else:
        atomic_write(path, lambda f: pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL), durable=durable)


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
    folder: str, entries: list[Entry], fmt: str, seed: Any, *, legacy: bool = False, storage_dir: str | None = None
) -> None:
    """Rewrite the index, then the metadata, of ``folder`` (each atomically) to name exactly ``entries``.

    The index goes first: a kill between the two leaves metadata counting fewer trajectories than the
    index lists, and the loaders here recount from the index. ``legacy`` also writes ``trajector_index.json``;
    ``storage_dir`` is what the metadata names (default: ``folder``).
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
    _write_json(os.path.join(folder, METADATA), metadata)


def _write_json(path: str, value: Any) -> None:
    blob = json.dumps(value).encode()

    def write(f: BinaryIO) -> None:
        f.write(blob)

    atomic_write(path, write)
