"""The ``<path>.metadata`` file: ObjectRL's checkpoint of a buffer, which names our data folder too.

* readable by plain ``torch.load`` (``weights_only=True``), a dict of plain ints and strings with at least
  ``buffer_size``, ``data_size`` and ``pointer``, as ObjectRL writes it. A full save adds ``data_dir``
  (the name of the data folder beside it) and ``data_manifest_crc32``. Every save adds
  ``metadata_crc32``: the zlib crc32 of all other entries as JSON (keys sorted, separators ``","`` and
  ``":"``, ASCII), so a flipped bit (``data_dir`` -> ``data_dis``) is refused instead of read as another
  checkpoint. Files without it (older saves, ObjectRL's own) are read as before.
* a full save of a buffer whose counters include rows that hold no data (restored by a metadata-only
  load, not yet overwritten) also records ``phantom``: how many of the oldest counted rows those are, so
  that a load never samples them. An optional key of format version 1: a file without it has none (all
  older checkpoints), and a reader older than this key loads the rows but would sample those too.
* a metadata-only save also records the ints an extra state asks for (its ``metadata_keys``, see
  :mod:`~objectrl_buffer.checkpoint.extras`: a rate limiter's counters) as ``extra.<name>.<key>``, so a
  metadata-only load restores them. Optional keys of format version 1, plain ints that ObjectRL (and an
  older objectrl_buffer) ignore; a file without them hands each extra empty values, as before.

Reading never blocks (a FIFO in its place is refused) and never unpickles objects.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from typing import Any

import torch

from objectrl_buffer.checkpoint.io import atomic_write, read_small_file
from objectrl_buffer.core import validate
from objectrl_buffer.core.validate import MAX_SIZE
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError

__all__ = [
    "METADATA_SUFFIX",
    "FORMAT",
    "FORMAT_VERSION",
    "checkpoint_base",
    "metadata_path",
    "metadata_crc32",
    "save_metadata",
    "load_metadata",
    "write_metadata_file",
    "read_metadata_file",
    "check_ring",
    "brief",
    "EXTRA_PREFIX",
    "extra_values",
]

METADATA_SUFFIX = ".metadata"
LOCK_SUFFIX = ".lock"  # <path>.metadata.lock: held by a save from its new data folder to its cleanup
FORMAT = "objectrl_buffer"
FORMAT_VERSION = 1  # of the metadata dict; the data folder carries its own (checkpoint_data.DATA_FORMAT_VERSION)
_GENERATION = r"\.data-[0-9a-f]{16}"
METADATA_CRC32 = "metadata_crc32"
#: The prefix of the extra-state ints a metadata-only save carries (``extra.rate_limiter.inserts``).
EXTRA_PREFIX = "extra."
#: ObjectRL's metadata is a few ints, ours a few more: anything this large is not a metadata file.
MAX_METADATA_BYTES = 16 << 20


def checkpoint_base(path: str | os.PathLike[str]) -> str:
    """The checkpoint ``path`` names, as the path its files are named after (``<base>.metadata``, ...).

    ``run`` and ``run.metadata`` (the metadata file's own name, as the CLI takes it) name the same
    checkpoint. Only where ``run.metadata`` does not exist but ``run.metadata.metadata`` does (saved by
    0.1.0 at a path ending in ``.metadata``) does ``run.metadata`` keep its old meaning, so such a
    checkpoint still loads and later saves go on writing it.

    Raises:
        InvalidArgumentError: ``path`` is not a str/PathLike, is empty or ends in a folder separator
            (every save, load and verify goes through here, so none writes or reads ``./.metadata``).
    """
    path = validate.path(path, "path")  # a non-empty str/PathLike naming a file: never ./.metadata
    if path.endswith(METADATA_SUFFIX) and (os.path.exists(path) or not os.path.exists(path + METADATA_SUFFIX)):
        return path[: -len(METADATA_SUFFIX)]
    return path


def metadata_path(path: str | os.PathLike[str]) -> str:
    """The metadata file of the checkpoint ``path`` (see :func:`checkpoint_base`): ``<base>.metadata``."""
    return checkpoint_base(path) + METADATA_SUFFIX


def brief(value: Any) -> str:
    """``repr(value)`` short enough for a one-line error (a 5000-digit int cannot even be printed)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<an int of {value.bit_length()} bits>"
    text = repr(value) if isinstance(value, (int, float, str, bytes, type(None))) else f"<a {type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def check_ring(meta: dict[str, Any], where: str) -> tuple[int, int, int]:
    """Validate ``buffer_size``/``data_size``/``pointer`` of a metadata dict; return them as ints."""
    try:
        values = tuple(meta[k] for k in ("buffer_size", "data_size", "pointer"))
    except KeyError as exc:
        raise CheckpointError(f"'{where}' lacks the key {exc.args[0]!r}") from None
    if not all(type(v) is int for v in values):
        shown = ", ".join(brief(v) for v in values)
        raise CheckpointError(f"'{where}': buffer_size, data_size and pointer must be ints, got {shown}")
    capacity, size, pointer = values
    if capacity > MAX_SIZE:
        raise CheckpointError(f"'{where}': buffer_size {brief(capacity)} is larger than any buffer ({MAX_SIZE})")
    valid = capacity > 0 and 0 <= size <= capacity and 0 <= pointer < capacity
    if not valid or (size < capacity and pointer != size):
        raise CheckpointError(
            f"'{where}': inconsistent ring state buffer_size={capacity}, data_size={size}, pointer={pointer}"
        )
    return capacity, size, pointer


def metadata_crc32(meta: dict[str, Any]) -> int:
    """The metadata file's own checksum: crc32 of every entry but ``metadata_crc32`` as canonical JSON.

    Raises:
        TypeError, ValueError, RecursionError: an entry JSON cannot encode (a key that is not a string,
            a tensor, a NaN, an int of more than 4300 digits, a nesting too deep).
    """
    rest = {k: v for k, v in meta.items() if k != METADATA_CRC32}
    if not all(isinstance(k, str) for k in rest):
        raise TypeError("metadata keys must be strings")
    encoded = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return zlib.crc32(encoded.encode("ascii"))


def save_metadata(path: str | os.PathLike[str], meta: dict[str, Any]) -> str:
    """Atomically write ``meta`` (plain ints/strings) and its crc32 to ``path``'s metadata file
    (:func:`metadata_path`); return that file name."""
    return write_metadata_file(metadata_path(path), meta)


def write_metadata_file(target: str, meta: dict[str, Any]) -> str:
    """:func:`save_metadata` to the metadata file ``target`` itself."""
    payload = {**meta, "format": FORMAT, "format_version": FORMAT_VERSION}
    try:
        payload[METADATA_CRC32] = metadata_crc32(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot save '{target}': the metadata must be plain ints and strings ({exc})") from None
    atomic_write(target, lambda f: torch.save(payload, f))
    return target


def _reason(exc: BaseException) -> str:
    """One line saying why ``torch.load`` failed, without torch's advice to load unsafely."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation"))]
    text = f"{type(exc).__name__}: {useful[0]}" if useful else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _check_own_crc32(meta: dict[str, Any], source: str) -> None:
    """Compare the metadata's ``metadata_crc32`` (when it has one) with its entries."""
    if METADATA_CRC32 not in meta:
        return
    recorded = meta[METADATA_CRC32]
    if type(recorded) is not int or not 0 <= recorded < 2**32:
        raise CheckpointError(f"'{source}' is corrupted: metadata_crc32 is {brief(recorded)}, expected a crc32")
    try:
        actual = metadata_crc32(meta)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"'{source}' is corrupted: its entries cannot be checksummed ({exc})") from None
    if actual != recorded:
        raise CheckpointError(
            f"'{source}' is corrupted: the crc32 of its entries is {actual:08x}, it records {recorded:08x}"
        )


def load_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``path``'s metadata file (:func:`metadata_path`) without unpickling objects; check its ring
    state and data reference.

    Raises:
        CheckpointNotFoundError: the file does not exist.
        CheckpointError: it is not a metadata dict (corrupt, truncated, a pickled object, a folder, a
            FIFO, over 16 MiB, a format version from the future, a ``metadata_crc32`` that does not
            match, an inconsistent ring state or one larger than any buffer, a bad ``data_dir``).
    """
    return read_metadata_file(metadata_path(path))


def read_metadata_file(source: str) -> dict[str, Any]:
    """:func:`load_metadata` of the metadata file ``source`` itself."""
    if not os.path.exists(source):
        raise CheckpointNotFoundError(f"no buffer checkpoint at '{source}'")
    if os.path.isdir(source):
        raise CheckpointError(f"'{source}' is a folder, expected a metadata file")
    try:
        # Read it ourselves: never blocks on a FIFO, never more than a metadata file can be.
        payload = read_small_file(source, MAX_METADATA_BYTES, follow_symlink=True)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no buffer checkpoint at '{source}'") from None
    try:
        meta = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged zip or pickle bytes make torch raise almost any class
        raise CheckpointError(
            f"'{source}' is not a readable metadata file (corrupt, truncated or unsafe): {_reason(exc)}"
        ) from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"'{source}' holds a {type(meta).__name__}, expected a metadata dict")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"'{source}' has format version {brief(version)}; this objectrl_buffer reads up to {FORMAT_VERSION}: "
            "upgrade it"
        )
    _check_own_crc32(meta, source)
    check_ring(meta, source)
    phantom = meta.get("phantom", 0)
    if type(phantom) is not int or not 0 <= phantom <= meta["data_size"]:
        raise CheckpointError(f"'{source}': phantom must be an int in [0, data_size], got {phantom!r}")
    for key, value in extra_values(meta).items():
        if type(value) is not int or not 0 <= value <= MAX_SIZE:
            raise CheckpointError(
                f"'{source}': {EXTRA_PREFIX}{key} must be an int in [0, {MAX_SIZE}], got {brief(value)}"
            )
    if "data_manifest_crc32" in meta and "data_dir" not in meta:  # a damaged key name, in a file without crc32
        raise CheckpointError(f"'{source}' is corrupted: it has data_manifest_crc32 but no data_dir")
    if "data_dir" in meta:
        base = os.path.basename(source)[: -len(METADATA_SUFFIX)]
        data_dir, crc = meta["data_dir"], meta.get("data_manifest_crc32")
        # Only a generation folder of this very checkpoint, never a path elsewhere on the disk.
        if not isinstance(data_dir, str) or not re.fullmatch(re.escape(base) + _GENERATION, data_dir):
            raise CheckpointError(f"'{source}': data_dir {brief(data_dir)} is not a data folder of this checkpoint")
        if type(crc) is not int:
            raise CheckpointError(f"'{source}': data_manifest_crc32 must be an int, got {brief(crc)}")
    return meta


def extra_values(meta: dict[str, Any]) -> dict[str, Any]:
    """The extra-state entries of a metadata dict (``extra.<name>.<key>``), keyed ``<name>.<key>``."""
    return {
        key.removeprefix(EXTRA_PREFIX): value
        for key, value in meta.items()
        if isinstance(key, str) and key.startswith(EXTRA_PREFIX)
    }
