"""Persistence: the ``<path>.metadata`` file ObjectRL runners checkpoint, written atomically.

The metadata file stays readable by plain ``torch.load`` (``weights_only=True``): a dict of plain
ints and strings with at least ``buffer_size``, ``data_size`` and ``pointer``, as ObjectRL writes it.
Loading never unpickles arbitrary objects.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

import torch

from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError

__all__ = ["METADATA_SUFFIX", "FORMAT", "metadata_path", "atomic_write", "save_metadata", "load_metadata", "check_ring"]

METADATA_SUFFIX = ".metadata"
FORMAT = "objectrl_buffer"
FORMAT_VERSION = 1


def metadata_path(path: str | os.PathLike[str]) -> str:
    """``path + ".metadata"`` for a ``str`` or ``os.PathLike`` path."""
    return os.fspath(path) + METADATA_SUFFIX


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(target: str, write: Callable[[BinaryIO], None]) -> None:
    """Write ``target`` via a temp file in its folder, fsync, ``os.replace``, fsync of the folder.

    A crash at any moment leaves either the old ``target`` or the new one, never a partial file.
    ``OSError`` is wrapped in :class:`CheckpointError` naming ``target``.
    """
    folder = os.path.dirname(os.path.abspath(target))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
        _fsync_dir(folder)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint file '{target}': {exc.strerror or exc}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def check_ring(meta: dict[str, Any], where: str) -> tuple[int, int, int]:
    """Validate ``buffer_size``/``data_size``/``pointer`` of a metadata dict; return them as ints."""
    try:
        values = tuple(meta[k] for k in ("buffer_size", "data_size", "pointer"))
    except KeyError as exc:
        raise CheckpointError(f"'{where}' lacks the key {exc.args[0]!r}") from None
    if not all(type(v) is int for v in values):
        raise CheckpointError(f"'{where}': buffer_size, data_size and pointer must be ints, got {values}")
    capacity, size, pointer = values
    valid = capacity > 0 and 0 <= size <= capacity and 0 <= pointer < capacity
    if not valid or (size < capacity and pointer != size):
        raise CheckpointError(
            f"'{where}': inconsistent ring state buffer_size={capacity}, data_size={size}, pointer={pointer}"
        )
    return capacity, size, pointer


def save_metadata(path: str | os.PathLike[str], meta: dict[str, Any]) -> str:
    """Atomically write ``meta`` (plain ints/strings) to ``path + ".metadata"``; return that file name."""
    target = metadata_path(path)
    payload = {**meta, "format": FORMAT, "format_version": FORMAT_VERSION}
    atomic_write(target, lambda f: torch.save(payload, f))
    return target


def load_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``path + ".metadata"`` without unpickling objects; check its ring state.

    Raises:
        CheckpointNotFoundError: the file does not exist.
        CheckpointError: it is not a metadata dict (corrupt, truncated, a pickled object, a folder,
            a format version from the future, an inconsistent ring state).
    """
    source = metadata_path(path)
    if not os.path.exists(source):
        raise CheckpointNotFoundError(f"no buffer checkpoint at '{source}'")
    if os.path.isdir(source):
        raise CheckpointError(f"'{source}' is a folder, expected a metadata file")
    try:
        meta = torch.load(source, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise CheckpointError(f"cannot read '{source}': {exc.strerror or exc}") from exc
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"'{source}' is not a readable metadata file (corrupt, truncated or unsafe): {exc}"
        ) from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"'{source}' holds a {type(meta).__name__}, expected a metadata dict")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"'{source}' has format version {version}; this objectrl_buffer reads up to {FORMAT_VERSION}: upgrade it"
        )
    check_ring(meta, source)
    return meta
