"""``manifest.json``: what a checkpoint's data folder holds, written as JSON and validated on the way back.

Data format version 1. Example (a MuJoCo buffer, abridged)::

    {
     "format": "objectrl_buffer.data",
     "format_version": 1,
     "created": {"library": "objectrl_buffer", "library_version": "0.1.0", "torch": "2.13.0+cpu",
                 "tensordict": "0.14.3", "torchrl": "0.14.1", "python": "3.11.7",
                 "time": "2026-11-21T12:05:29+00:00", "host": "vm"},
     "byteorder": "little",
     "ring": {"buffer_size": 1000000, "data_size": 1000000, "pointer": 123},
     "columns": [{"key": ["state"], "shape": [17], "dtype": "float32", "file": "000-state.bin",
                  "bytes": 68000000, "crc32": "9d92974a"}, ...],
     "sampling": {"shuffle": false,
                  "generator": {"device": "cpu", "initial_seed": 0, "state": "<base64 of get_state()>"}},
     "devices": {"device": "cuda:0", "storing_device": "cpu"},
     "extras": {"arrays": [{"name": "prioritized.priority", "shape": [1000000], "dtype": "float64",
                            "file": "extra-prioritized.priority.bin", "bytes": 8000000, "crc32": "5a01c2d4"}],
                "values": {"prioritized.max_priority": 7.25, "prioritized.alpha": 0.6, ...}}
    }

``key`` is the list of a (possibly nested) tensordict key's parts; ``dtype`` a torch dtype name;
``bytes`` is always ``data_size * prod(shape) * itemsize``. Readers refuse a newer ``format_version``
and ignore keys they do not know, so later versions may add keys without breaking older readers.

``extras`` (optional; absent in checkpoints of a plain buffer) is where a buffer subclass keeps its
own state: ``arrays`` are raw files like the columns (any shape, ``bytes = prod(shape) * itemsize``,
crc32, file name ``extra-<name>.bin``), ``values`` small JSON scalars (finite numbers, bools,
strings). Names are dotted, the owner first (``prioritized.priority``). The key was added within data
format version 1: a reader that predates it ignores it and loads the rows without the extras.
``ring.num_envs`` (optional, added within data format version 1, written only when not 1; absent
means 1) is the buffer's number of vector envs: it divides the other three ring values. A reader
that predates it ignores it and loads the rows as one env's.
Parsing never executes anything: ``json.loads``, then type and range checks of every field, and
bounds on what it may declare before anything is allocated: columns only with rows (each file holds
``data_size`` rows of its column, which sizes the rows), at most 2**62 slots and storage bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import platform
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from typing import Any, TypeAlias

import torch

from objectrl_buffer.core.schema import INDEX_KEY, Field, Key, Schema, format_key
from objectrl_buffer.core.validate import MAX_SIZE
from objectrl_buffer.errors import CheckpointError

__all__ = [
    "DATA_FORMAT",
    "DATA_FORMAT_VERSION",
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "Column",
    "ExtraArray",
    "ExtraValue",
    "Manifest",
    "column_file_name",
    "extra_file_name",
    "manifest_bytes",
    "parse_manifest",
]

DATA_FORMAT = "objectrl_buffer.data"
DATA_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: A manifest is a few hundred bytes per column: anything larger is not one (and is not read whole).
MAX_MANIFEST_BYTES = 16 << 20

_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_FILE_NAME = re.compile(r"[0-9]{3,}-[A-Za-z0-9_.-]{0,64}\.bin")
_EXTRA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")

#: A scalar kept in the manifest's ``extras.values``.
ExtraValue: TypeAlias = bool | int | float | str


@dataclass(frozen=True)
class Column:
    """One column file as the manifest describes it."""

    field: Field
    file: str
    nbytes: int
    crc32: int


@dataclass(frozen=True)
class ExtraArray:
    """One extra array file (a buffer subclass's own state) as the manifest describes it."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    file: str
    nbytes: int
    crc32: int


@dataclass(frozen=True)
class Manifest:
    """A validated ``manifest.json``: ring state, columns, sampling state, devices, creation info."""

    buffer_size: int
    data_size: int
    pointer: int
    columns: tuple[Column, ...]
    shuffle: bool
    generator_device: str
    generator_seed: int
    generator_state: bytes
    device: str
    storing_device: str
    created: dict[str, Any]
    format_version: int
    extra_arrays: tuple[ExtraArray, ...] = ()
    extra_values: dict[str, ExtraValue] = field(default_factory=dict)
    num_envs: int = 1

    @property
    def schema(self) -> Schema | None:
        """The stored fields in file order (``None`` for a checkpoint of an empty buffer)."""
        return Schema([c.field for c in self.columns]) if self.columns else None

    @property
    def nbytes(self) -> int:
        """Bytes of all column files together."""
        return sum(c.nbytes for c in self.columns)

    @property
    def extra_nbytes(self) -> int:
        """Bytes of all extra array files together."""
        return sum(a.nbytes for a in self.extra_arrays)


def column_file_name(index: int, key: Key) -> str:
    """``"003-next_state.bin"``: the column's position, then its key made file-name safe (for humans)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", format_key(key))[:64]
    return f"{index:03d}-{readable}.bin"


def extra_file_name(name: str) -> str:
    """``"extra-prioritized.priority.bin"``: the file of the extra array ``name``.

    Raises:
        ValueError: ``name`` is not a letter followed by up to 63 of ``A-Z a-z 0-9 _ . -``.
    """
    if not _EXTRA_NAME.fullmatch(name):
        raise ValueError(f"bad extra name {name!r}: a letter, then up to 63 of A-Z a-z 0-9 _ . -")
    return f"extra-{name}.bin"


def _creation_info() -> dict[str, Any]:
    def version(dist: str) -> str:
        try:
            return importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            return "unknown"

    return {
        "library": "objectrl_buffer",
        "library_version": version("objectrl_buffer"),
        "torch": torch.__version__,
        "tensordict": version("tensordict"),
        "torchrl": version("torchrl"),
        "python": platform.python_version(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
    }


def manifest_bytes(
    columns: list[Column],
    ring: tuple[int, int, int],
    shuffle: bool,
    generator: torch.Generator,
    device: torch.device,
    storing_device: torch.device,
    extra_arrays: Sequence[ExtraArray] = (),
    extra_values: Mapping[str, ExtraValue] | None = None,
    *,
    num_envs: int = 1,
) -> bytes:
    """The manifest of a data folder holding ``columns``, as UTF-8 JSON. ``ring``: (buffer_size, data_size, pointer).

    ``extras`` is written only when there are extra arrays or values (a plain buffer's manifest is
    unchanged).

    Raises:
        ValueError: an extra value is not a finite number, a bool or a string, or its name is bad.
    """
    manifest: dict[str, Any] = {
        "format": DATA_FORMAT,
        "format_version": DATA_FORMAT_VERSION,
        "created": _creation_info(),
        "byteorder": sys.byteorder,
        "ring": dict(zip(("buffer_size", "data_size", "pointer"), ring, strict=True)),
        "columns": [
            {
                "key": [c.field.key] if isinstance(c.field.key, str) else list(c.field.key),
                "shape": list(c.field.shape),
                "dtype": str(c.field.dtype).removeprefix("torch."),
                "file": c.file,
                "bytes": c.nbytes,
                "crc32": f"{c.crc32:08x}",
            }
            for c in columns
        ],
        "sampling": {
            "shuffle": bool(shuffle),
            "generator": {
                "device": generator.device.type,
                "initial_seed": int(generator.initial_seed()),
                "state": base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii"),
            },
        },
        "devices": {"device": str(device), "storing_device": str(storing_device)},
    }
    if num_envs != 1:  # a one-env manifest stays as it was before vector envs
        manifest["ring"]["num_envs"] = num_envs
    values = dict(extra_values or {})
    if extra_arrays or values:
        for name, value in values.items():
            extra_file_name(name)  # validates the name
            if not _extra_value(value):
                raise ValueError(f"extra value {name!r} must be a finite number, a bool or a string, got {value!r}")
        manifest["extras"] = {
            "arrays": [
                {
                    "name": a.name,
                    "shape": list(a.shape),
                    "dtype": str(a.dtype).removeprefix("torch."),
                    "file": a.file,
                    "bytes": a.nbytes,
                    "crc32": f"{a.crc32:08x}",
                }
                for a in extra_arrays
            ],
            "values": values,
        }
    return json.dumps(manifest, indent=1, allow_nan=False).encode("utf-8")


def _require(condition: bool, where: str, problem: str) -> None:
    if not condition:
        raise CheckpointError(f"'{where}' is not a valid manifest: {problem}")


def _int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _shape(value: Any) -> bool:
    """Whether ``value`` is a shape torch can hold: at most 64 sizes >= 0 whose product fits a byte count.

    Checked in Python ints: ``torch.Size([2**62, 2**62]).numel()`` wraps around to 0.
    """
    return (
        isinstance(value, list)
        and len(value) <= 64
        and all(_int(s) and s <= MAX_SIZE for s in value)
        and math.prod(value) <= MAX_SIZE
    )


def _extra_value(value: Any) -> bool:
    """Whether ``value`` may be an extra value: a bool, an int, a finite float or a string."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (bool, int, str))


def _parse_column(raw: Any, rows: int, where: str) -> Column:
    _require(isinstance(raw, dict), where, f"a column entry is {type(raw).__name__}, expected an object")
    key, shape, dtype_name, name = raw.get("key"), raw.get("shape"), raw.get("dtype"), raw.get("file")
    _require(
        isinstance(key, list) and bool(key) and all(isinstance(p, str) and p for p in key) and key != [INDEX_KEY],
        where,
        f"bad column key {key!r}",
    )
    _require(_shape(shape), where, f"bad shape {shape!r} of {key}")
    _require(dtype_name in _DTYPES, where, f"unknown dtype {dtype_name!r} of {key}")
    _require(isinstance(name, str) and _FILE_NAME.fullmatch(name) is not None, where, f"bad file name {name!r}")
    field = Field(key[0] if len(key) == 1 else tuple(key), torch.Size(shape), _DTYPES[dtype_name])
    nbytes = raw.get("bytes")
    _require(nbytes == rows * field.row_bytes, where, f"column {key} records {nbytes} bytes for {rows} rows")
    crc = raw.get("crc32")
    _require(isinstance(crc, str) and re.fullmatch(r"[0-9a-f]{8}", crc) is not None, where, f"bad crc32 {crc!r}")
    return Column(field, name, rows * field.row_bytes, int(crc, 16))


def _parse_extra_array(raw: Any, where: str) -> ExtraArray:
    _require(isinstance(raw, dict), where, f"an extra array entry is {type(raw).__name__}, expected an object")
    name, shape, dtype_name, file = raw.get("name"), raw.get("shape"), raw.get("dtype"), raw.get("file")
    _require(isinstance(name, str) and _EXTRA_NAME.fullmatch(name) is not None, where, f"bad extra name {name!r}")
    _require(_shape(shape), where, f"bad shape {shape!r} of {name}")
    _require(dtype_name in _DTYPES, where, f"unknown dtype {dtype_name!r} of {name}")
    _require(file == extra_file_name(name), where, f"bad file name {file!r} of {name}")
    size, dtype = torch.Size(shape), _DTYPES[dtype_name]
    nbytes = size.numel() * dtype.itemsize
    _require(raw.get("bytes") == nbytes, where, f"extra array {name} records {raw.get('bytes')} bytes for {shape}")
    crc = raw.get("crc32")
    _require(isinstance(crc, str) and re.fullmatch(r"[0-9a-f]{8}", crc) is not None, where, f"bad crc32 {crc!r}")
    return ExtraArray(name, size, dtype, file, nbytes, int(crc, 16))


def _parse_extras(raw: Any, where: str) -> tuple[tuple[ExtraArray, ...], dict[str, ExtraValue]]:
    """The optional ``extras`` object: ``(arrays, values)``, both empty when it is absent."""
    if raw is None:
        return (), {}
    _require(isinstance(raw, dict), where, "'extras' must be an object")
    arrays_raw, values = raw.get("arrays", []), raw.get("values", {})
    _require(isinstance(arrays_raw, list), where, "'extras.arrays' must be a list")
    _require(isinstance(values, dict), where, "'extras.values' must be an object")
    arrays = tuple(_parse_extra_array(a, where) for a in arrays_raw)
    names = [a.name for a in arrays]
    _require(len(set(names)) == len(names), where, "an extra array name appears twice")
    for name, value in values.items():
        _require(_EXTRA_NAME.fullmatch(name) is not None, where, f"bad extra name {name!r}")
        _require(
            _extra_value(value), where, f"extra value {name!r} is {value!r}, expected a finite number, bool or str"
        )
    return arrays, values


def parse_manifest(payload: bytes, where: str) -> Manifest:
    """Validate the bytes of a manifest file (``where`` names it in errors).

    Raises:
        CheckpointError: not JSON (nested too deeply, an int of 4300+ digits included), a field missing
            or of the wrong type or range, a data format version newer than this library reads, written
            on a machine of the other byte order, or declaring more than its files can hold: columns
            with 0 rows, a buffer_size, a shape's element count or a storage (buffer_size * row
            bytes) over 2**62, a device torch cannot parse or ``meta``.
    """
    try:
        raw = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: also an int of 4300+ digits
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CheckpointError(f"'{where}' is not valid JSON: {reason}") from None
    _require(isinstance(raw, dict) and raw.get("format") == DATA_FORMAT, where, f"'format' is not {DATA_FORMAT!r}")
    version = raw.get("format_version")
    _require(_int(version), where, f"bad format_version {version!r}")
    if version > DATA_FORMAT_VERSION:
        raise CheckpointError(
            f"'{where}' has data format version {version}; this objectrl_buffer reads up to "
            f"{DATA_FORMAT_VERSION}: upgrade objectrl_buffer"
        )
    if raw.get("byteorder") != sys.byteorder:
        raise CheckpointError(
            f"'{where}' was written on a {raw.get('byteorder')}-endian machine, this is {sys.byteorder}"
        )
    try:
        ring, sampling, devices, gen = raw["ring"], raw["sampling"], raw["devices"], raw["sampling"]["generator"]
        capacity, rows, pointer = ring["buffer_size"], ring["data_size"], ring["pointer"]
        _require(all(_int(v) for v in (capacity, rows, pointer)), where, "ring values must be ints >= 0")
        _require(capacity <= MAX_SIZE, where, f"buffer_size is larger than any buffer ({MAX_SIZE})")
        _require(capacity > 0 and rows <= capacity and pointer < capacity, where, f"bad ring state {ring}")
        _require(rows == capacity or pointer == rows, where, f"bad ring state {ring}")
        num_envs = ring.get("num_envs", 1)
        _require(
            _int(num_envs) and num_envs > 0 and not (capacity % num_envs or rows % num_envs or pointer % num_envs),
            where,
            f"num_envs {num_envs!r} does not divide the ring state {ring}",
        )
        manifest = Manifest(
            capacity,
            rows,
            pointer,
            tuple(_parse_column(c, rows, where) for c in raw["columns"]),
            sampling["shuffle"],
            gen["device"],
            gen["initial_seed"],
            base64.b64decode(gen["state"], validate=True),
            devices["device"],
            devices["storing_device"],
            raw.get("created", {}),
            version,
            *_parse_extras(raw.get("extras"), where),
            num_envs=num_envs,
        )
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"'{where}' is not a valid manifest: missing or malformed {exc}") from None
    except (binascii.Error, ValueError) as exc:
        raise CheckpointError(f"'{where}' is not a valid manifest: bad generator state ({exc})") from None
    keys = [c.field.key for c in manifest.columns]
    _require(len(set(keys)) == len(keys), where, "a key appears twice")
    _require(rows == 0 or bool(keys), where, f"{rows} rows but no columns")
    # Bound what it declares by what its files hold, before anything is allocated: a column's file
    # holds rows * row bytes (checked against its size), so with 0 rows it could declare any row.
    # Writers record columns only for rows they hold.
    _require(rows > 0 or not keys, where, f"0 rows but {len(keys)} columns (columns are recorded with rows only)")
    row_bytes = sum(c.field.row_bytes for c in manifest.columns)
    _require(
        capacity * row_bytes <= MAX_SIZE,
        where,
        f"{capacity} rows of {row_bytes} bytes are more bytes than any storage holds ({MAX_SIZE})",
    )
    _require(isinstance(manifest.shuffle, bool) and type(manifest.generator_seed) is int, where, "bad sampling")
    _require(isinstance(manifest.created, dict), where, "bad 'created'")
    for name in ("generator_device", "device", "storing_device"):
        value = getattr(manifest, name)
        _require(isinstance(value, str) and _device(value), where, f"bad {name} {str(value)[:40]!r}")
    return manifest


def _device(name: str) -> bool:
    """Whether ``name`` is a device rows could be on (``meta`` tensors have no data)."""
    try:
        return torch.device(name).type != "meta"
    except (RuntimeError, ValueError):
        return False
