"""AWorld's ``Storage`` interface (same method names, so custom storages port unchanged) and the in-memory one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from objectrl_buffer.core.validate import _brief, positive_int
from objectrl_buffer.errors import InvalidArgumentError

from ..query_filter import QueryCondition
from ..rows import DataRow, row_list
from ..table import TaskTable

__all__ = ["Storage", "TableStorage", "InMemoryStorage"]


class Storage(ABC):
    """Where a task buffer's rows live, grouped by ``exp_meta.task_id``."""

    @abstractmethod
    def add(self, data: DataRow) -> None:
        """Store one row."""

    @abstractmethod
    def add_batch(self, data_batch: list[DataRow]) -> None:
        """Store rows in order."""

    @abstractmethod
    def size(self, query_condition: QueryCondition | None = None) -> int:
        """How many rows match (all rows without a query)."""

    @abstractmethod
    def get_paginated(self, page: int, page_size: int, query_condition: QueryCondition | None = None) -> list[DataRow]:
        """Page ``page`` (from 1) of ``page_size`` matching rows."""

    @abstractmethod
    def get_all(self, query_condition: QueryCondition | None = None) -> list[DataRow]:
        """Every matching row."""

    @abstractmethod
    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of one task ([] if none)."""

    def get_batch_by_task_ids(self, task_ids: list[str]) -> dict[str, list[DataRow]]:
        """``{task_id: rows}`` for the held tasks among ``task_ids`` (default: one :meth:`get_by_task_id` each)."""
        found = {task_id: self.get_by_task_id(task_id) for task_id in task_ids}
        return {task_id: rows for task_id, rows in found.items() if rows}

    def get_bacth_by_task_ids(self, task_ids: list[str]) -> dict[str, list[DataRow]]:
        """AWorld's spelling of :meth:`get_batch_by_task_ids`; samplers call this one, so a storage ported from
        AWorld (which defines only this spelling) and ours both work."""
        return self.get_batch_by_task_ids(task_ids)

    def clear(self) -> None:
        """Remove every row."""
        raise NotImplementedError


def _page_args(page: int, page_size: int) -> tuple[int, int]:
    """``page`` and ``page_size`` as positive ints; InvalidArgumentError (a ValueError, with AWorld's message)
    naming the argument otherwise."""
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise InvalidArgumentError(f"Page must be greater than 0, got page={_brief(page)}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise InvalidArgumentError(f"Page size must be greater than 0, got page_size={_brief(page_size)}")
    return page, page_size


def _task_ids(task_ids: Any) -> list[str]:
    """``task_ids`` as a list of str; InvalidArgumentError naming the argument (stored task_ids are str, so
    anything else is a caller's bug: an unhashable ``[1]`` raised a bare TypeError)."""
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
        raise InvalidArgumentError(f"task_ids must be a list of str task_ids, got {_brief(task_ids)}")
    found = list(task_ids)
    for i, t in enumerate(found):
        if not isinstance(t, str):
            raise InvalidArgumentError(f"task_ids[{i}] must be a str task_id, got {_brief(t)}")
    return found


class TableStorage(Storage):
    """A storage whose reads run on a :class:`TaskTable` (queries compiled to tensor masks).

    Subclasses provide :meth:`_table` (bringing it up to date first, for shared storages) and the writes.
    """

    max_capacity: int

    def _table(self) -> TaskTable:
        raise NotImplementedError

    def get_table(self) -> TaskTable:
        """The up-to-date table (read it, do not change it)."""
        return self._table()

    def replace_table(self, table: TaskTable) -> None:
        """Hold exactly ``table``'s rows (what ``load`` does)."""
        raise NotImplementedError

    def size(self, query_condition: QueryCondition | None = None) -> int:
        table = self._table()
        return table.n if not query_condition else int(table.mask(query_condition).sum())

    def __len__(self) -> int:
        return self.size()

    def get_paginated(self, page: int, page_size: int, query_condition: QueryCondition | None = None) -> list[DataRow]:
        page, page_size = _page_args(page, page_size)
        rows = self._table().select(query_condition)
        return rows[(page - 1) * page_size : page * page_size]

    def get_all(self, query_condition: QueryCondition | None = None) -> list[DataRow]:
        return self._table().select(query_condition)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """Every row of ``task_id`` in insertion order ([] if none); InvalidArgumentError unless a str."""
        if not isinstance(task_id, str):
            raise InvalidArgumentError(f"task_id must be a str, got {_brief(task_id)}")
        return self._table().by_task_ids([task_id]).get(task_id, [])

    def get_batch_by_task_ids(self, task_ids: list[str]) -> dict[str, list[DataRow]]:
        """``{task_id: rows}`` of the held tasks among ``task_ids``; InvalidArgumentError unless a list of str."""
        return self._table().by_task_ids(_task_ids(task_ids))

    def matching_task_ids(self, query_condition: QueryCondition | None = None) -> list[str]:
        """task_ids with a row matching the query, oldest task first (what samplers draw from)."""
        return self._table().matching_task_ids(query_condition)


class InMemoryStorage(TableStorage):
    """Rows in this process's memory, at most ``max_capacity`` of them: a store that would pass it first evicts
    whole tasks, oldest first insertion first. Each row is counted once. A stored row with a JSON-native
    payload is held as JSON text and built into a :class:`DataRow` on its first read; later reads return that
    same object (a store creates no Python objects per row, so it stays cheap for the garbage collector).

    Raises (storing nothing), each naming the field or argument: :class:`~objectrl_buffer.errors.InvalidTypeError`
    (an ``InvalidArgumentError`` that is also a ``TypeError``) for a field or payload of the wrong type (a bool
    or str ``step``, an int ``task_id``, a complex reward, ``object()``, nesting deeper than 65 levels) or a
    ``data_batch`` that is not a list; :class:`~objectrl_buffer.errors.InvalidArgumentError` for a missing row
    or ``exp_meta``, when one task alone would hold more than ``max_capacity`` rows, for a ``step`` outside
    int64 (NaN, inf, ``2**70``), a number beyond float64 (``10**400``) or a tensor without plain data (meta
    device, sparse, quantized). ``step``/``execute_time`` may be NumPy scalars or 0-d real tensors (stored as
    their Python number).
    """

    def __init__(self, max_capacity: int = 10000) -> None:
        self.max_capacity = positive_int(max_capacity, "max_capacity")
        self.table = TaskTable()

    def _table(self) -> TaskTable:
        return self.table

    def add(self, data: DataRow) -> None:
        self.table.store([data], self.max_capacity)

    def add_batch(self, data_batch: Sequence[DataRow]) -> None:
        self.table.store(row_list(data_batch), self.max_capacity)

    def clear(self) -> None:
        self.table.clear()

    def replace_table(self, table: TaskTable) -> None:
        self.table = table
