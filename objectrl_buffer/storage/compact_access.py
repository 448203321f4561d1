"""How the engine's readers and per-step writer reach a compact storage (:mod:`~objectrl_buffer.storage.compact`).

* :class:`VirtualColumn`: a compact key as a column, for code that reads ``storage.columns[key]``
  (n-step targets, copies): ``index_select`` rebuilds the rows.
* :class:`FastRow`: the per-step ``add`` path (``storage.fast``) of a one-env CPU compact storage.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from objectrl_buffer.core.schema import Field, Key, Schema

if TYPE_CHECKING:
    from objectrl_buffer.storage.compact import CompactStorage

__all__ = ["VirtualColumn", "Columns", "FastRow", "nonzero"]


class VirtualColumn:
    """A compact key's rows as far as readers of ``storage.columns`` need: ``index_select(0, slots)``,
    slices (copies), ``shape``, ``dtype``, ``device``. Each read rebuilds the rows (new tensors)."""

    def __init__(self, storage: CompactStorage, field: Field) -> None:
        self._storage = storage
        self.field = field
        self.dtype = field.dtype
        self.device = storage.device
        self.shape = torch.Size([storage.capacity, *field.shape])

    def dim(self) -> int:
        return len(self.shape)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        assert dim == 0
        return self._storage.gather_key(self.field.key, index)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, stop, step = rows.indices(self.shape[0])
        return self.index_select(0, torch.arange(start, stop, step, device=self.device))

    def __len__(self) -> int:
        return self.shape[0]


class Columns(Mapping[Key, Any]):
    """The table's columns and the compact keys' :class:`VirtualColumn` s, in schema order."""

    def __init__(self, storage: CompactStorage) -> None:
        self._storage = storage

    def __getitem__(self, key: Key) -> Any:
        storage = self._storage
        if key in storage.virtual:
            return storage.virtual[key]
        if storage.table is None:
            raise KeyError(key)
        return storage.table.columns[key]

    def __iter__(self) -> Iterator[Key]:
        schema = self._storage.schema
        return iter(() if schema is None else [f.key for f in schema.fields])

    def __len__(self) -> int:
        schema = self._storage.schema
        return 0 if schema is None else len(schema.fields)


def nonzero(value: Any) -> bool:
    """Whether a row's value of an episode-end key (a tensor, array or number) ends the episode."""
    if isinstance(value, torch.Tensor):
        return bool(value) if value.numel() == 1 else bool(value.any())
    return bool(np.any(value))


class FastRow:
    """The engine's per-step fast path (``storage.fast``) of a one-env CPU compact storage.

    Takes a plain ``dict`` whose observed and next values are CPU tensors or arrays of exactly the stored
    dtype and shape (used in place: no copy), checks the overlap (:meth:`CompactStorage.check_one`), writes
    the other keys with the table's own :class:`~objectrl_buffer.storage.fast_write.FastWriter` (which checks
    and converts them, or declines before writing), then stores the frames. Anything else declines
    (``False``, nothing written) and the engine takes the checked path.
    """

    def __init__(self, storage: CompactStorage, schema: Schema) -> None:
        self.storage = storage
        self.observed = {
            f.key: (f.dtype, tuple(f.shape), np.dtype(str(f.dtype).removeprefix("torch.")))
            for f in schema.fields
            if f.key in storage.virtual
        }
        self.others = [f.key for f in schema.fields if f.key not in storage.virtual]

    def write_row(self, data: Any, slot: int, cast_ok: Container[Key]) -> bool:
        storage = self.storage
        table = storage.table
        if type(data) is not dict or not storage.steps or table is None or table.fast is None:
            return False
        values: dict[Key, Any] = {}
        for key, (dtype, shape, np_dtype) in self.observed.items():
            value = data.get(key)
            if type(value) is torch.Tensor:
                if value.dtype != dtype or value.shape != shape or value.device.type != "cpu":
                    return False
                value = value.detach().numpy()
            elif type(value) is not np.ndarray or value.dtype != np_dtype or value.shape != shape:
                return False
            values[key] = value
        others = {}
        for key in self.others:
            if key not in data:
                return False
            others[key] = data[key]
        if len(data) != len(values) + len(others) + ("index" in data):
            return False
        ended = any(nonzero(others[key]) for key in storage.end_keys if key in others)
        storage.check_one(values, ended)
        if slot >= table.reserved:
            table.reserve_rows(slot + 1)
        if not table.fast.write_row(others, slot, cast_ok):
            return False
        storage.store_one(slot, values, ended)
        return True

    def write_batch(self, data: Any, ring: Any) -> int:
        return -1  # batches take the checked path (write_rows checks them as a whole)
