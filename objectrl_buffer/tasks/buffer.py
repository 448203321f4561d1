"""``TaskReplayBuffer``: AWorld's ``ReplayBuffer`` (store rows, sample whole tasks through a query), over a
storage whose queries compile to tensor masks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from objectrl_buffer.core import validate
from objectrl_buffer.errors import InvalidArgumentError

from .persist import load_table, save_table
from .query_filter import QueryCondition
from .rows import DataRow, row_list
from .samplers import Converter, DefaultConverter, RandomTaskSample, Sampler, TaskSampler
from .storage.base import InMemoryStorage, Storage, TableStorage

__all__ = ["TaskReplayBuffer"]


class TaskReplayBuffer:
    """Experience rows grouped by task, sampled a task at a time.

    Args:
        storage: where rows live; ``None`` builds a fresh :class:`InMemoryStorage` for this buffer (upstream
            shared one default storage between every buffer). Use :class:`SharedTaskStorage` for rows written
            by several processes.
        seed: seed of the default sampler's generator (``None``: derived from torch's seed, see core/seeding.py).
    """

    def __init__(self, storage: Storage | None = None, *, seed: int | None = None) -> None:
        self._storage = InMemoryStorage() if storage is None else storage
        self._sampler = RandomTaskSample(seed)

    @property
    def storage(self) -> Storage:
        return self._storage

    def store(self, data: DataRow) -> None:
        """Store one row (:class:`~objectrl_buffer.errors.InvalidArgumentError` when None; see the storage for
        the rest)."""
        if data is None:
            raise InvalidArgumentError("Data is required: data is None, not a DataRow")
        self._storage.add(data)

    def store_batch(self, data_batch: Sequence[DataRow]) -> None:
        """Store rows in order, all or nothing on bad input (:class:`~objectrl_buffer.errors.InvalidArgumentError`
        naming ``data_batch`` when empty, :class:`~objectrl_buffer.errors.InvalidTypeError` when not a list)."""
        rows = row_list(data_batch, "data_batch")
        if not rows:
            raise InvalidArgumentError("Data batch is required: data_batch is empty")
        self._storage.add_batch(rows)

    def __len__(self) -> int:
        return self._storage.size()

    def len(self) -> int:
        """Rows held (AWorld-style method; same as ``len(buffer)``)."""
        return len(self)

    def sample_task(
        self,
        sampler: TaskSampler | None = None,
        query_condition: QueryCondition | None = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
    ) -> list[Any]:
        """Up to ``batch_size`` tasks having a row that matches the query, each as *all* its rows sorted by
        ``(step, execute_time)`` and passed through ``converter`` (default: the rows themselves)."""
        sampler = self._sampler if sampler is None else sampler
        converter = DefaultConverter() if converter is None else converter
        tasks = sampler.sample_tasks(self._storage, batch_size, query_condition)
        return [converter.to_dataset_row(rows) for rows in tasks.values()]

    def sample(
        self,
        sampler: Sampler | None = None,
        query_condition: QueryCondition | None = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
    ) -> Any:
        """``converter.to_dataset_row(sampler.sample(...))``: with a task sampler, ``{task_id: rows}``
        (insertion order, unsorted) of up to ``batch_size`` matching tasks (AWorld's ``sample``)."""
        sampler = self._sampler if sampler is None else sampler
        converter = DefaultConverter() if converter is None else converter
        return converter.to_dataset_row(sampler.sample(self._storage, batch_size, query_condition))

    def _table_storage(self, what: str) -> TableStorage:
        if not isinstance(self._storage, TableStorage):
            raise InvalidArgumentError(f"{what} needs an InMemoryStorage or SharedTaskStorage, not {self._storage!r}")
        return self._storage

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every row (payloads, vocabularies, FIFO order) to the folder ``path``: atomic, crc32-checked.

        Raises :class:`~objectrl_buffer.errors.InvalidArgumentError` naming ``path`` when it is not a non-empty
        ``str`` or ``os.PathLike`` of one, or a file is in the way of the folder (nothing written), and
        :class:`~objectrl_buffer.errors.CheckpointError` when writing fails.
        """
        folder = validate.folder(path, "path")
        storage = self._table_storage("save")
        save_table(storage.get_table(), folder, storage.max_capacity)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Replace this buffer's rows with those saved at ``path`` (verified before anything changes).

        Raises :class:`~objectrl_buffer.errors.CheckpointError` for a missing or corrupt checkpoint and
        :class:`~objectrl_buffer.errors.InvalidArgumentError` when its rows do not fit this storage's capacity,
        or naming ``path`` when it is not a non-empty ``str`` or ``os.PathLike`` of one, or is a file.
        """
        folder = validate.folder(path, "path")
        storage = self._table_storage("load")
        table, _ = load_table(folder)
        if table.n > storage.max_capacity:
            where, cap = folder, storage.max_capacity
            raise InvalidArgumentError(
                f"the checkpoint at '{where}' holds {table.n} rows, more than max_capacity={cap}"
            )
        storage.replace_table(table)
