"""How the engine's readers reach a compact storage's rows (:mod:`~objectrl_buffer.storage.compact`).

* :class:`VirtualColumn`: a compact key as a column, for code that reads ``storage.columns[key]``
  (n-step targets, copies): ``index_select`` rebuilds the rows.
* :class:`Columns`: ``storage.columns``, the table's columns and the virtual ones in schema order.

(The per-step write path is :mod:`~objectrl_buffer.storage.compact_step`.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from objectrl_buffer.core.schema import Field, Key

if TYPE_CHECKING:
    from objectrl_buffer.storage.compact import CompactStorage

__all__ = ["VirtualColumn", "Columns"]


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
