"""What travels between a remote buffer's handle, its writers and its shards (see :mod:`.remote`).

* A write: flat ``{key: NumPy array or number}`` (:func:`to_numpy`; Ray's zero-copy path), or a
  :class:`SharedRows` descriptor of rows a writer on the shard's node left in its own files
  (:func:`writer_prefix`, :func:`column_path`; the shard maps them, :mod:`.mapped`).
* A draw: one ``bytes`` object (:func:`pack` / :func:`unpack`): the shard's mass and its drawn columns.
"""

from __future__ import annotations

import json
import math
import os
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from objectrl_buffer.storage.folders import PREFIX

__all__ = [
    "MISSING",
    "RAW_WEIGHT",
    "SharedRows",
    "column_path",
    "flat",
    "from_numpy",
    "pack",
    "to_numpy",
    "unpack",
    "writer_prefix",
]

#: ``(p + eps) ** alpha`` of each drawn row of a prioritized shard (the handle turns it into weights).
RAW_WEIGHT = "_raw_weight"


def flat(data: TensorDictBase | Mapping[str, Any]) -> dict[str, Any]:
    """A write as a flat ``{key: value}`` dict (nested TensorDict keys joined by ``"."``; values as they are)."""
    if not isinstance(data, TensorDictBase):
        return dict(data)
    items = data.items(include_nested=True, leaves_only=True)
    return {".".join(key) if isinstance(key, tuple) else key: value for key, value in items}


def to_numpy(data: TensorDictBase | Mapping[str, Any]) -> dict[str, Any]:
    """A write as flat ``{key: NumPy array or number}`` (nested keys joined by ``"."``)."""
    return {
        key: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        for key, value in flat(data).items()
    }


#: ``mass`` (float64), ``rows`` (int64) and the header's length (uint32) at the start of a packed draw.
_PREFIX = struct.Struct("<dqI")
_HEADERS: dict[tuple[tuple[str, np.dtype, tuple[int, ...]], ...], bytes] = {}  # layout -> its JSON header
_LAYOUTS: dict[bytes, list[tuple[str, np.dtype, tuple[int, ...], int]]] = {}  # JSON header -> layout


def _cached(cache: dict[Any, Any], key: Any, make: Any) -> Any:
    value = cache.get(key)
    if value is None:
        if len(cache) >= 64:  # a handful of layouts in a run; bounded all the same
            cache.clear()
        value = cache[key] = make()
    return value


def pack(mass: float, columns: Mapping[str, np.ndarray]) -> bytes:
    """A shard's draw as one ``bytes`` object: its ``mass`` and ``[n, ...]`` NumPy columns (``n`` rows each).

    Why one ``bytes``: Ray returns it for ~0.05 ms more than an empty call here, a dict of seven 256-row
    NumPy arrays for ~0.35 ms more (each array is one more out-of-band pickle buffer, each nesting level
    one more pass of Ray's serializer). The layout travels as a small JSON header (never unpickled).
    """
    layout = tuple((key, value.dtype, value.shape[1:]) for key, value in columns.items())
    header = _cached(_HEADERS, layout, lambda: json.dumps([[k, d.str, list(shape)] for k, d, shape in layout]).encode())
    rows = len(next(iter(columns.values()))) if columns else 0
    data = [np.ascontiguousarray(value).data for value in columns.values()]
    return b"".join([_PREFIX.pack(mass, rows, len(header)), header, *data])


def unpack(packed: bytes, copy: bool = True) -> tuple[float, int, dict[str, np.ndarray]]:
    """``(mass, rows, columns)`` of a :func:`pack` ed draw: the columns are views of one writable copy of the
    bytes (``copy=False``: read-only views of the bytes themselves, for a caller that copies them anyway).

    Raises:
        ValueError: the bytes do not hold what their header says.
    """
    mass, rows, size = _PREFIX.unpack_from(packed)
    start = _PREFIX.size + size
    header = packed[_PREFIX.size : start]

    def parse() -> list[tuple[str, np.dtype, tuple[int, ...], int]]:
        return [(k, np.dtype(d), tuple(shape), math.prod(shape)) for k, d, shape in json.loads(header)]

    layout = _cached(_LAYOUTS, header, parse)
    data = memoryview(packed)[start:]
    size = rows * sum(width * dtype.itemsize for _, dtype, _, width in layout)
    if size != len(data):
        raise ValueError(f"a packed draw of {len(data)} bytes for a layout of {size}")
    buffer = bytearray(data) if copy else data
    out, offset = {}, 0
    for key, dtype, shape, width in layout:
        out[key] = np.frombuffer(buffer, dtype, rows * width, offset).reshape(rows, *shape)
        offset += rows * width * dtype.itemsize
    return mass, rows, out


#: What ``add_batch`` returns for a :class:`SharedRows` batch whose files it cannot see (and for that writer's
#: later batches, until the refused one comes again): send them again as rows, in order.
MISSING = -1


def writer_prefix(buffer_id: str, writer: str) -> str:
    """The name every folder of ``writer``'s column files starts with, for the buffer ``buffer_id``: a shard
    maps only folders so named (:meth:`.shard.Shard.add_batch`)."""
    return f"{PREFIX}writer-{buffer_id}-{writer}-"


def column_path(folder: str, index: int, field: int) -> str:
    """The file of column ``field`` of a same-node writer's column set ``index`` in its ``folder``."""
    return os.path.join(folder, f"set-{index}-{field}.bin")


@dataclass(frozen=True)
class SharedRows:
    """A batch a writer on the shard's node left in its files: the first ``rows`` rows of column set ``index``
    in ``folder``, each column a file of ``capacity`` rows (:func:`column_path`, in ``layout`` order:
    ``(key, NumPy dtype string, per-row shape)``). A few hundred bytes through Ray whatever the batch."""

    folder: str
    index: int
    rows: int
    capacity: int
    layout: tuple[tuple[str, str, tuple[int, ...]], ...]


def from_numpy(data: Mapping[str, Any]) -> dict[str, Any]:
    """Tensors over ``data``'s arrays. Read-only ones (a writer's mapped files) are only read (the storage
    copies them): torch's warning about them is silenced."""
    if all(v.flags.writeable for v in data.values() if isinstance(v, np.ndarray)):
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in data.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in data.items()}
