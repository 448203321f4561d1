"""Per-schema fast paths for the per-step writes (``add``) and batched writes (``add_batch``) on CPU storage.

Why this exists: :meth:`Schema.check` accepts every input form and names what is wrong, but it pays
for that generality (a generator over nested leaves, ``isinstance`` against ABCs, ~1 µs per key),
and torch's indexing costs 2-3 µs per ``column[slot] = value`` (3 µs for a Python number). A training
loop hands over the same plain form millions of times. So once per schema we precompute a tuple of
(key, expected dtype/shape, NumPy view of the column) and, per call, check each value with identity
comparisons and write it through the NumPy view of the same memory (0.1-0.4 µs per key).

The fast path only takes inputs it fully understands: a ``dict`` or a plain ``TensorDict`` with exactly
the stored top-level keys (plus, maybe, the ignored ``"index"``), holding CPU ``torch.Tensor`` values
of the stored dtype and shape, NumPy arrays or scalars of the stored shape whose dtype casts without a
value check (:func:`~objectrl_buffer.core.schema.cast_rule`: float64 -> float32 yes, int64 -> int32 no; a
float column narrower than float64 takes them only if no value could overflow to inf, a cheap sum-of-squares or
max check), or Python numbers for 0-d keys that the column holds exactly (floats within its range). Anything
else returns "not handled" *before writing* and the caller takes the full path, which stores the same
bytes or raises the precise error. So a rejected write still leaves the buffer unchanged.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.casts import SAME, UNCHECKED, cast_rule, exact_ints, narrows, real_part
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import INDEX_KEY, Key, Schema
from objectrl_buffer.storage.row_writer import RowWriter, compile_row_writer, pwrite_rows
from objectrl_buffer.storage.torchrl_compat import plain_items

__all__ = ["FastWriter", "numpy_views", "WIDE_ROW_BYTES"]

#: Rows at least this wide (Atari frames: 28 KB) are written with ``os.pwrite`` into the column's file
#: instead of through the shared mapping. Once the kernel has written a page of a disk-backed shared
#: mapping back, it write-protects the page, so every later store into it takes a page fault: ~14
#: faults (~30 us) per 56 KB transition. ``pwrite`` copies into the same page cache without faulting,
#: and reads through the mapping see the bytes at once (Linux has one page cache per file).
WIDE_ROW_BYTES = 8192

# What a column accepts as a Python number (the Schema.check rule: no float into a non-float column).
_FLOAT, _INT, _BOOL, _NONE = "float", "int", "bool", "none"


def numpy_views(columns: dict[Key, torch.Tensor]) -> dict[Key, np.ndarray] | None:
    """NumPy views sharing memory with CPU ``columns`` (``None`` if a dtype has no NumPy twin)."""
    try:
        return {key: column.numpy() for key, column in columns.items()}
    except (TypeError, RuntimeError):
        return None


def _torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return None


class FastWriter:
    """Checks and writes one schema's plain inputs straight into NumPy views of the columns.

    Build it with :meth:`build`; it is ``None`` for schemas it cannot serve (nested keys, dtypes
    without a NumPy twin), and then every write takes the full path.
    """

    def __init__(self, schema: Schema, arrays: dict[Key, np.ndarray], files: dict[Key, str] | None = None) -> None:
        self.n_keys = len(schema.fields)
        # the value of `limit`, in a list the compiled write_row reads too (a reference to this writer
        # from that function would make a cycle, and keep the column mappings alive until a GC pass)
        self.bound = [1 << 62]
        self.fds: dict[Key, int] = {}  # wide columns written with os.pwrite (see WIDE_ROW_BYTES)
        for field in schema.fields:
            if files and field.key in files and field.row_bytes >= WIDE_ROW_BYTES:
                self.fds[field.key] = os.open(files[field.key], os.O_RDWR)
        entries = []
        for field in schema.fields:
            array = arrays[field.key]
            if field.shape:
                scalar = _NONE
            elif field.dtype.is_floating_point or field.dtype.is_complex:
                scalar = _FLOAT
            elif field.dtype == torch.bool:
                scalar = _BOOL
            else:
                scalar = _INT
            # the Python ints this column holds exactly (bool: 0 and 1), and the floats it holds without inf
            low, high = exact_ints(field.dtype) if scalar != _NONE else (0, 1)
            limit = torch.finfo(field.dtype).max if scalar == _FLOAT else math.inf
            entries.append(
                (field.key, field.dtype, tuple(field.shape), array, scalar, low, high, limit, {array.dtype: True})
            )
        self.entries = tuple(entries)
        # columns where a NumPy batch of a wider float dtype is checked for values that would become inf
        self._narrow = {
            id(arrays[f.key]): float(torch.finfo(real_part(f.dtype)).max)
            for f in schema.fields
            if narrows(torch.float64, f.dtype)
        }
        # the slot's bytes are written last, and only for wide columns: (fd, bytes per row) by column id
        self._wide = {id(arrays[key]): (fd, schema.by_key[key].row_bytes) for key, fd in self.fds.items()}
        #: ``write_row(data, slot, cast_ok=()) -> bool``: write one transition to ``slot`` if it is a plain
        #: input that fits; ``False`` (nothing written) if not. ``cast_ok``: keys whose one-element tensors
        #: may be cast into their 0-d column by the rules of a Python number (the checked path has given
        #: those keys their ``CastWarning`` already; ObjectRL's DQN stores int64 ``[1]`` policy actions into
        #: a float32 ``()`` column on every step). Compiled for this schema (``row_writer.py`` says why).
        self.write_row: RowWriter = compile_row_writer(self)

    @classmethod
    def build(
        cls, schema: Schema, columns: dict[Key, torch.Tensor], files: dict[Key, str] | None = None
    ) -> FastWriter | None:
        """A writer for ``schema`` over CPU ``columns``, or ``None`` if the fast path cannot serve it.

        ``files``: the memmap file behind each column, for the ``pwrite`` path of wide rows.
        """
        if any(not isinstance(f.key, str) for f in schema.fields):
            return None
        arrays = numpy_views(columns)
        return None if arrays is None else cls(schema, arrays, files)

    @property
    def limit(self) -> int:
        """Slots below this may be written; a write reaching past it is declined, so that the full path
        reserves the rows first (RAM-backed storage reserves lazily: see storage.TransitionStorage._grow)."""
        return self.bound[0]

    @limit.setter
    def limit(self, rows: int) -> None:
        self.bound[0] = rows

    def wide(self, array: np.ndarray) -> tuple[int, int] | None:
        """``(file descriptor, bytes per row)`` if ``array``'s rows are written with ``os.pwrite`` (see
        :data:`WIDE_ROW_BYTES`), else ``None``."""
        return self._wide.get(id(array))

    def close(self) -> None:
        """Close the files of the wide columns (the writer is unusable afterwards)."""
        fds, self.fds, self._wide = self.fds, {}, {}
        for fd in fds.values():
            os.close(fd)

    def store(self, array: np.ndarray, first: int, value: Any) -> None:
        """``array[first : first + len(value)] = value``, through ``pwrite`` for a wide column."""
        wide = self._wide.get(id(array))
        if wide is None:
            array[first : first + len(value)] = value
        else:
            pwrite_rows(*wide, first, value, array.dtype)

    def _items(self, data: Any, batch_dims: int) -> dict[Any, Any] | None:
        """The key -> value dict of a plain input with the stored keys (and maybe "index"), else ``None``."""
        items = data if type(data) is dict else plain_items(data, batch_dims)
        if items is None:
            return None
        extra = len(items) - self.n_keys  # an "index" key (a sample written back) is dropped, as on the full path
        if extra == 0 or (extra == 1 and INDEX_KEY in items):
            return items
        return None

    @staticmethod
    def castable(cache: dict[np.dtype, bool], np_dtype: np.dtype, dtype: torch.dtype) -> bool:
        """Whether NumPy values of ``np_dtype`` go into a ``dtype`` column as they are; cached (``False`` too)."""
        ok = cache.get(np_dtype)
        if ok is None:
            source = _torch_dtype(np_dtype)
            # casts that need a look at the values (int64 -> int32) take the checked path
            ok = cache[np_dtype] = source is not None and cast_rule(source, dtype) in (SAME, UNCHECKED)
        return ok

    def write_batch(self, data: Any, ring: Ring) -> int:
        """Write a batch of ``N`` rows where ``ring.placement(N)`` puts them; return ``N`` (the caller then
        advances the ring).

        Keeps only the newest ``capacity`` rows when ``N > capacity``. Returns ``-1`` (nothing written)
        when the input is not a plain batch that fits, or reaches past :attr:`limit`.
        """
        items = self._items(data, 1)
        if items is None:
            return -1
        values = []
        n = -1
        try:
            for key, dtype, shape, array, _, _, _, _, casts in self.entries:
                value = items[key]
                kind = type(value)
                if kind is torch.Tensor:
                    if value.dtype is not dtype:
                        return -1
                    value = value.numpy()
                elif kind is not np.ndarray or not (casts.get(value.dtype) or self.castable(casts, value.dtype, dtype)):
                    return -1
                elif value.dtype is not array.dtype and id(array) in self._narrow:
                    # a finite value beyond the column's range would become inf: the checked path refuses it
                    # (nan and inf, or values near the limit, also take it; it decides element by element)
                    limit = self._narrow[id(array)]
                    if value.size and not np.abs(value).max() <= limit:  # nan propagates: checked path
                        return -1
                rows = value.shape
                if len(rows) != len(shape) + 1 or rows[1:] != shape or (n >= 0 and rows[0] != n):
                    return -1
                n = rows[0]
                values.append((array, value))
        except (KeyError, RuntimeError, TypeError):
            return -1
        start, kept = ring.placement(n)
        parts = ring.spans(start, kept)
        if parts[0][1] > self.limit:
            return -1
        first = n - kept
        for array, value in values:
            for lo, hi in parts:  # one range, or two at the wrap
                self.store(array, lo, value[first : first + hi - lo])
                first += hi - lo
            first = n - kept
        return n
