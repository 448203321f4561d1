"""A task storage in Redis (``redis-py``, the optional ``redis`` extra): the rows of a task buffer shared by
processes on several machines, with the same queries as :class:`InMemoryStorage` because they run on the same
table.

Keys (under ``key_prefix``):

* ``log``: a Redis list of records, each ``kind`` (1 byte), the task_id's length (u32) and bytes, then for a
  row its bytes (:func:`~objectrl_buffer.tasks.codec.encode_row`: JSON + raw tensor bytes, never pickle).
  Kinds: a row, the eviction of a whole task, a clear.
* ``base``: how many records were dropped from the head of ``log`` (its first record's absolute number).
* ``settings``: a hash holding ``max_capacity`` (fixed when the keys are made).

Every process keeps a :class:`TaskTable` mirror and reads only the records appended since its last read (one
Lua script: ``base`` and the new records, atomically), so a query costs one round trip plus the new rows, then
runs on tensor columns locally. A store plans its evictions on the up-to-date mirror with the same FIFO rule as
the in-memory storage and appends in a ``WATCH``/``MULTI`` transaction: a store that raced another is planned
again, so concurrent writers on any machine never break the capacity. When the log holds more than twice the
live rows (and 1024), a store rewrites it as a clear plus the live rows (readers that fall behind rebuild from
there).
"""

from __future__ import annotations

import struct
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from objectrl_buffer.core.group_fifo import plan_store
from objectrl_buffer.core.validate import _brief, positive_int
from objectrl_buffer.errors import BufferUnavailable, CheckpointError, InvalidArgumentError

from ..codec import decode_row, encode_row
from ..rows import DataRow, normalize_row, row_list
from ..table import TaskTable
from .base import TableStorage

__all__ = ["RedisTaskStorage", "redis_url"]

_ROW, _EVICT, _CLEAR = 1, 2, 3
_HEAD = struct.Struct("<BI")
_COMPACT_MIN = 1024

# base and the records from absolute number ARGV[1] on, in one atomic step (the list's length too, so a reader
# whose position is past the end, after someone deleted the keys, starts again)
_READ = """
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local n = redis.call('LLEN', KEYS[1])
local start = tonumber(ARGV[1]) - base
if start < 0 or start > n then start = 0 end
return {base, n, redis.call('LRANGE', KEYS[1], start, -1)}
"""


def redis_url(host: str = "localhost", port: int = 6379, db: int = 0, password: str | None = None) -> str:
    """The ``redis://`` URL of a server given as AWorld's ``RedisStorage`` arguments (the password quoted)."""
    auth = "" if password is None else ":" + urllib.parse.quote(password, safe="") + "@"
    return f"redis://{auth}{host}:{int(port)}/{int(db)}"


def _record(kind: int, task_id: str, payload: bytes = b"") -> bytes:
    name = task_id.encode()
    return _HEAD.pack(kind, len(name)) + name + payload


class RedisTaskStorage(TableStorage):
    """Task rows in a Redis server, shared by every process (on any machine) that opens the same keys.

    Args:
        max_capacity: rows held at most; whole oldest tasks are evicted first (as :class:`InMemoryStorage`).
            The keys keep the capacity they were made with; opening them with another raises.
        url: the server, ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).
        key_prefix: the keys' common prefix; storages with the same URL and prefix share their rows.

    The storage pickles as its arguments: hand it (or the buffer holding it) to other processes. Reads and
    queries behave exactly as :class:`InMemoryStorage`'s (the rows come back as the in-memory storage returns
    them: payloads in their JSON form, tensors as CPU tensors).

    Raises:
        InvalidArgumentError: naming ``url``, ``key_prefix`` or ``max_capacity`` (also when the keys were made
            with another capacity); the in-memory storage's errors for bad rows (nothing stored).
        BufferUnavailable: the server cannot be reached (the URL named).
        CheckpointError: the keys hold something this storage did not write (the key named).
    """

    def __init__(
        self,
        max_capacity: int = 10000,
        *,
        url: str = "redis://localhost:6379/0",
        key_prefix: str = "objectrl_buffer:tasks:",
    ) -> None:
        self.max_capacity = positive_int(max_capacity, "max_capacity")
        if not isinstance(url, str) or not url:
            raise InvalidArgumentError(f"url must be a redis:// URL, got {_brief(url)}")
        if not isinstance(key_prefix, str):
            raise InvalidArgumentError(f"key_prefix must be a str, got {_brief(key_prefix)}")
        self.url, self.key_prefix = url, key_prefix
        self._connect()
        with self._talking("open"):
            settings = self._key("settings")
            self._client.hsetnx(settings, "max_capacity", self.max_capacity)
            held = self._client.hget(settings, "max_capacity")
        try:
            held_capacity = int(held)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise CheckpointError(f"Redis key '{settings}' holds no task storage settings") from None
        if held_capacity != self.max_capacity:
            raise InvalidArgumentError(
                f"'{key_prefix}' at {self._where()} holds a task storage of max_capacity={held_capacity}, "
                f"not max_capacity={self.max_capacity}"
            )

    def _connect(self) -> None:
        try:
            self._client = redis.Redis.from_url(self.url)
        except ValueError as exc:
            raise InvalidArgumentError(f"url {self.url!r} is not a Redis URL: {exc}") from None
        self._read_script = self._client.register_script(_READ)
        self._mirror = TaskTable()
        self._position = 0  # absolute number of the next record the mirror has not read

    def _key(self, name: str) -> str:
        return self.key_prefix + name

    def _where(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"  # no password in messages

    @contextmanager
    def _talking(self, what: str) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BufferUnavailable(f"the Redis server at {self._where()} is unreachable ({what}): {exc}") from exc

    def __getstate__(self) -> dict[str, Any]:
        return {"max_capacity": self.max_capacity, "url": self.url, "key_prefix": self.key_prefix}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_capacity, self.url, self.key_prefix = state["max_capacity"], state["url"], state["key_prefix"]
        self._connect()

    def close(self) -> None:
        """Close this process's connections (the rows stay in Redis)."""
        self._client.close()

    # -- reading --
    def _sync(self, client: Any) -> None:
        """Bring the mirror up to date with every appended record (``client``: the connection, or a pipeline
        that is watching the keys)."""
        keys = [self._key("log"), self._key("base")]
        base, length, records = self._read_script(keys=keys, args=[self._position], client=client)
        base, length = int(base), int(length)
        if not base <= self._position <= base + length:  # the log was rewritten past us (or the keys deleted)
            self._mirror.clear()
            self._position = base
        start = self._position - base
        table = self._mirror
        decoded = [self._decode(base + start + i, r) for i, r in enumerate(records)]  # checked before changes
        pending: list[DataRow] = []
        values: list[tuple[object, ...]] = []

        def flush() -> None:
            table.append(pending, values)
            table.note_appended([r.exp_meta.task_id for r in pending])
            pending.clear()
            values.clear()

        for kind, task_id, found in decoded:
            if found is not None:
                pending.append(found[0])
                values.append(found[1])
                continue
            flush()
            if kind == _EVICT:
                table.remove_tasks([task_id])
            else:
                table.clear()
        flush()
        self._position = base + length

    def _decode(self, number: int, record: bytes) -> tuple[int, str, tuple[DataRow, tuple[Any, ...]] | None]:
        where = f"Redis key '{self._key('log')}' record {number}"
        try:
            kind, size = _HEAD.unpack_from(record)
            task_id = bytes(record[_HEAD.size : _HEAD.size + size]).decode()
            if kind == _ROW:
                return kind, task_id, normalize_row(decode_row(memoryview(record)[_HEAD.size + size :]))
        except (struct.error, ValueError, TypeError, RecursionError) as exc:
            raise CheckpointError(f"{where} is not a task storage record: {str(exc)[:300]}") from exc
        if kind not in (_EVICT, _CLEAR):
            raise CheckpointError(f"{where} has the unknown kind {kind}")
        return kind, task_id, None

    def _table(self) -> TaskTable:
        with self._talking("read"):
            self._sync(self._client)
        return self._mirror

    # -- writes --
    def _transaction(self, plan: Callable[[], list[bytes] | None], rewrite: bool) -> None:
        """Append the records ``plan()`` makes from the up-to-date mirror (``rewrite``: replace the whole log
        with them instead), planned again whenever another process wrote in between."""
        log, base = self._key("log"), self._key("base")
        with self._talking("store"), self._client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(log, base)
                    self._sync(pipe)
                    records = plan()
                    if records is None:
                        return
                    pipe.multi()
                    if rewrite:
                        pipe.delete(log)
                        pipe.set(base, self._position)
                    if records:
                        pipe.rpush(log, *records)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def add(self, data: DataRow) -> None:
        self.add_batch([data])

    def add_batch(self, data_batch: Sequence[DataRow]) -> None:
        """Store rows in order (all or nothing on bad input; see :class:`InMemoryStorage` for the errors)."""
        stored, _ = TaskTable.prepare(row_list(data_batch))
        if not stored:
            return
        task_ids = [r.exp_meta.task_id for r in stored]
        encoded = [_record(_ROW, t, encode_row(r)) for t, r in zip(task_ids, stored, strict=True)]

        def records() -> list[bytes]:
            store = plan_store(self._mirror.counts.copy(), task_ids, self.max_capacity)
            out = [_record(_EVICT, str(t)) for t in store.evicted]
            return out + [e for e, keep in zip(encoded, store.keep, strict=True) if keep]

        self._transaction(records, rewrite=False)
        with self._talking("compact"):
            length = int(self._client.llen(self._key("log")))
        if length > max(2 * self._mirror.n, _COMPACT_MIN):
            self._transaction(lambda: self._rows_records(self._mirror.each_row()), rewrite=True)

    @staticmethod
    def _rows_records(rows: Iterable[DataRow]) -> list[bytes]:
        return [_record(_CLEAR, ""), *(_record(_ROW, r.exp_meta.task_id, encode_row(r)) for r in rows)]

    def clear(self) -> None:
        self.replace_table(TaskTable())

    def replace_table(self, table: TaskTable) -> None:
        """Hold exactly ``table``'s rows, in one transaction (no process sees a half-replaced buffer)."""
        if table.n > self.max_capacity:
            raise InvalidArgumentError(f"{table.n} rows do not fit max_capacity={self.max_capacity}")
        records = self._rows_records(table.each_row())
        self._transaction(lambda: records, rewrite=True)

    def delete_keys(self) -> None:
        """Remove this storage's keys from Redis (its rows and settings); the storage is unusable afterwards."""
        with self._talking("delete"):
            self._client.delete(self._key("log"), self._key("base"), self._key("settings"))
