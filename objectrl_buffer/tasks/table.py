"""The columnar table behind every task storage: one Python list of stored rows (the payloads) beside tensor
columns of their query fields, kept in insertion order; whole tasks leave with one compaction pass.

A row stored with a JSON-native payload is kept as one JSON text (:func:`~.rows.encode_record`) and built
into its :class:`DataRow` when first read, then kept as that object: a store makes no Python objects per
row (nothing for the cyclic garbage collector to walk again and again), and a row read twice is the same
object. Rows holding tensors or other non-JSON values are kept as the normalised ``DataRow`` at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from objectrl_buffer.core.gc_pause import gc_paused
from objectrl_buffer.core.group_fifo import GroupCounts, plan_store
from objectrl_buffer.core.vocab import Vocab

from .query_filter import QueryCondition, compile_query
from .rows import META_STRINGS, NUMERIC, DataRow, decode_record, encode_record, normalize_row

__all__ = ["TaskTable"]


class TaskTable:
    """Rows in insertion order: row ``i`` (:meth:`row`) with ``codes[:, i]`` (int64 ``[4]``: task_id, task_name,
    agent_id, pre_agent codes, -1 for None) and ``numbers[:, i]`` (float64 ``[5]``: step, execute_time, reward_t, adv_t,
    v_t, NaN for None), CPU. Field-major, so each query column is one contiguous run.
    ``counts`` holds rows per task_id in order of first insertion (FIFO order)."""

    def __init__(self) -> None:
        self.vocabs = {name: Vocab() for name in META_STRINGS}
        self._rows: list[DataRow | str] = []  # a str: the row's JSON record, not read yet
        self._codes = torch.empty((len(META_STRINGS), 0), dtype=torch.int64)
        self._numbers = torch.empty((len(NUMERIC), 0), dtype=torch.float64)
        self.counts = GroupCounts()

    @property
    def n(self) -> int:
        return len(self._rows)

    @property
    def rows(self) -> list[DataRow]:
        """Every row, in insertion order (each built on first read)."""
        return self.take(range(self.n))

    def row(self, i: int) -> DataRow:
        """Row ``i``, built from its record on first read and kept, so every read returns the same object."""
        found = self._rows[i]
        if isinstance(found, str):
            found = self._rows[i] = decode_record(found)
        return found

    def each_row(self) -> Iterator[DataRow]:
        """Every row in insertion order, those not read yet built for this walk only (``save`` goes through
        every row once; keeping them all built would hold a Python object per row from then on)."""
        for r in self._rows:
            yield decode_record(r) if isinstance(r, str) else r

    def take(self, index: Sequence[int]) -> list[DataRow]:
        """The rows at ``index`` (ints in ``[0, n)``), in that order."""
        rows, row = self._rows, self.row
        with gc_paused():  # the rows built here all survive (as the store's did before rows were built on read)
            return [
                row(i) if isinstance(r, str) else r for i, r in zip(index, map(rows.__getitem__, index), strict=True)
            ]

    # -- the Columns protocol of query_filter --
    def string_column(self, name: str) -> tuple[torch.Tensor, Vocab]:
        return self._codes[META_STRINGS.index(name), : self.n], self.vocabs[name]

    def number_column(self, name: str) -> torch.Tensor:
        return self._numbers[NUMERIC.index(name), : self.n]

    def mask(self, query: QueryCondition | None) -> torch.Tensor:
        """bool ``[n]``: rows matching ``query`` (QueryError for a malformed one)."""
        return compile_query(query, self)

    # -- writes --
    @staticmethod
    def prepare(rows: Sequence[object]) -> tuple[list[DataRow], list[tuple[object, ...]]]:
        """Normalise every row first (a bad one raises before anything is stored)."""
        stored, values = [], []
        for row in rows:
            s, v = normalize_row(row)
            stored.append(s)
            values.append(v)
        return stored, values

    @staticmethod
    def prepare_compact(rows: Sequence[object]) -> tuple[list[DataRow | str], list[tuple[object, ...]]]:
        """:meth:`prepare`, with each row that :func:`encode_record` takes kept as its JSON record instead."""
        stored: list[DataRow | str] = []
        values = []
        for row in rows:
            found = encode_record(row)
            s, v = normalize_row(row) if found is None else found
            stored.append(s)
            values.append(v)
        return stored, values

    def store(self, rows: Sequence[object], capacity: int) -> None:
        """Store ``rows`` in order, evicting whole oldest tasks so at most ``capacity`` rows stay.

        All or nothing: a bad row, or a task that alone would exceed ``capacity``, raises and stores nothing.
        """
        with gc_paused():  # the new rows all survive: collections during the batch would only re-walk them
            stored, values = self.prepare_compact(rows)
        plan = plan_store(self.counts, [v[0] for v in values], capacity)
        self.remove_tasks([str(t) for t in plan.evicted])
        if all(plan.keep):
            self.append(stored, values)
        else:
            self.append(
                [r for r, k in zip(stored, plan.keep, strict=False) if k],
                [v for v, k in zip(values, plan.keep, strict=False) if k],
            )
        self.counts = plan.apply()

    def append(self, rows: Sequence[DataRow | str], values: list[tuple[object, ...]]) -> None:
        """Append normalised rows (no capacity check; ``counts`` updated by the caller when it plans)."""
        if not rows:
            return
        width = len(META_STRINGS)
        columns = list(zip(*values, strict=True))  # field-major, like the tensors: one list per column
        codes = torch.tensor(
            [self.vocabs[name].codes(columns[j]) for j, name in enumerate(META_STRINGS)],
            dtype=torch.int64,
        )
        numbers = torch.tensor(columns[width:], dtype=torch.float64)
        self._grow(self.n + len(rows))
        start = self.n
        self._codes[:, start : start + len(rows)] = codes
        self._numbers[:, start : start + len(rows)] = numbers
        self._rows.extend(rows)

    def note_appended(self, task_ids: list[str]) -> None:
        """Count appended rows of ``task_ids`` (for a table mirrored from a log, where the writer planned)."""
        for t in task_ids:
            self.counts.rows[t] = self.counts.rows.get(t, 0) + 1
        self.counts.total += len(task_ids)

    def _grow(self, needed: int) -> None:
        if needed <= self._codes.shape[1]:
            return
        size = max(needed, 2 * self._codes.shape[1], 1024)
        codes = torch.empty((self._codes.shape[0], size), dtype=torch.int64)
        numbers = torch.empty((self._numbers.shape[0], size), dtype=torch.float64)
        codes[:, : self.n] = self._codes[:, : self.n]
        numbers[:, : self.n] = self._numbers[:, : self.n]
        self._codes, self._numbers = codes, numbers

    def remove_tasks(self, task_ids: Sequence[str]) -> None:
        """Drop every row of ``task_ids`` (one pass; order of the others kept)."""
        found = [c for c in map(self.vocabs["task_id"].find, task_ids) if c is not None]
        for t in task_ids:
            self.counts.total -= self.counts.rows.pop(t, 0)
        if not found:
            return
        keep = ~self.vocabs["task_id"].member_mask(self.string_column("task_id")[0], found)
        index = keep.nonzero().squeeze(1)
        n = index.numel()
        self._codes[:, :n] = self._codes[:, index]
        self._numbers[:, :n] = self._numbers[:, index]
        self._rows = list(map(self._rows.__getitem__, index.tolist()))

    def clear(self) -> None:
        self._rows = []
        self.counts = GroupCounts()

    # -- reads --
    def select(self, query: QueryCondition | None) -> list[DataRow]:
        """The rows matching ``query``, in insertion order."""
        if not query:
            return self.rows
        return self.take(self.mask(query).nonzero().squeeze(1).tolist())

    def matching_task_ids(self, query: QueryCondition | None) -> list[str]:
        """task_ids with at least one row matching ``query``, in FIFO order (first insertion)."""
        if not query:
            return [str(t) for t in self.counts.rows]
        codes = self.string_column("task_id")[0][self.mask(query)]
        hit = set(torch.unique(codes).tolist())
        vocab = self.vocabs["task_id"]
        return [str(t) for t in self.counts.rows if vocab.find(t) in hit]

    def by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        """``{task_id: its rows in insertion order}`` for each held task of ``task_ids`` (one pass)."""
        vocab = self.vocabs["task_id"]
        wanted = {c: t for t in task_ids if (c := vocab.find(t)) is not None and t in self.counts.rows}
        out: dict[str, list[DataRow]] = {t: [] for t in wanted.values()}
        if not wanted:
            return out
        column = self.string_column("task_id")[0]
        index = vocab.member_mask(column, list(wanted)).nonzero().squeeze(1)
        index_list = index.tolist()
        for r, c in zip(self.take(index_list), column[index].tolist(), strict=True):
            out[wanted[c]].append(r)
        return out
