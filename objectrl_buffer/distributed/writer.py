"""The batching writer of a :class:`~objectrl_buffer.distributed.remote.RemoteBuffer`: single adds copied into
preallocated columns client-side and sent as ``add_batch`` calls, at most ``max_in_flight`` unacknowledged
(see :class:`Writer`; :meth:`RemoteBuffer.writer <objectrl_buffer.distributed.remote.RemoteBuffer.writer>` makes one).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDictBase

from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.core.validate import positive_int, real_in
from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.distributed.wire import (
    MISSING,
    SharedRows,
    column_path,
    flat,
    to_numpy,
    writer_prefix,
)
from objectrl_buffer.errors import BufferUnavailable, InvalidArgumentError, ReplayBufferError
from objectrl_buffer.flow.limited import batch_rows
from objectrl_buffer.storage.fast_write import FastWriter
from objectrl_buffer.storage.folders import make_owned, sweep_once
from objectrl_buffer.storage.placement import SHM_DIR, default_parent, is_tmpfs, reserve

if TYPE_CHECKING:
    from objectrl_buffer.distributed.remote import RemoteBuffer

__all__ = ["Writer"]


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class _Columns:
    """One batch being filled: preallocated NumPy columns of ``batch_size`` rows and the library's compiled
    per-schema row writer over them (:func:`~objectrl_buffer.storage.row_writer.compile_row_writer`, the
    single-process ``add``'s fast path): one call checks a plain row's keys, dtypes and shapes and stores it,
    or declines (nothing written).

    With a ``folder``, the columns are files there (set ``index``, :func:`~.wire.column_path`), their pages
    reserved up front (a full tmpfs raises ``OSError`` here, never ``SIGBUS`` on a later write), mapped
    shared: a shard on this node reads them as they are.

    Raises:
        OSError: the files could not be made (none are left behind).
    """

    def __init__(self, schema: Schema, batch_size: int, folder: str | None = None, index: int = 0) -> None:
        self.folder, self.index, self.capacity = folder, index, batch_size
        self.layout = tuple(
            (str(field.key), _numpy_dtype(field.dtype).str, tuple(field.shape)) for field in schema.fields
        )
        if folder is None:
            self.columns: dict[str, np.ndarray] = {
                key: np.empty((batch_size, *shape), dtype=dtype) for key, dtype, shape in self.layout
            }
        else:
            paths = [column_path(folder, index, j) for j in range(len(self.layout))]
            try:
                self.columns = {
                    key: np.asarray(np.memmap(path, np.dtype(dtype), "w+", 0, (batch_size, *shape)))
                    for path, (key, dtype, shape) in zip(paths, self.layout, strict=True)
                }
                reserve(paths)
            except (OSError, ValueError) as exc:
                for path in paths:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise OSError(f"writer column files in {folder}: {exc}") from None
        views = {field.key: self.columns[str(field.key)] for field in schema.fields}
        self.write_row = FastWriter(schema, views).write_row

    def rows(self, n: int) -> dict[str, np.ndarray]:
        """The first ``n`` rows of each column (views)."""
        return {key: column[:n] for key, column in self.columns.items()}

    def shared(self, n: int) -> SharedRows:
        """The descriptor of the first ``n`` rows (only for a set in files)."""
        assert self.folder is not None
        return SharedRows(self.folder, self.index, n, self.capacity, self.layout)


def _remove_folder(folder: str, lock_fd: int) -> None:
    """Remove a writer's folder, then let go of its lock (run at :meth:`Writer.close` or process exit)."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


def _declined(data: Any, slot: int, cast_ok: Any = ()) -> bool:
    """The row writer before the first row: declines every row (the first row fixes the schema)."""
    return False


class Writer:
    """Batches single ``add`` s client-side into ``add_batch`` calls of ``batch_size`` rows (or whatever is
    pending after ``flush_every_s``), with at most ``max_in_flight`` batches unacknowledged; a batch that
    meets a restarting shard is sent again under its ``(writer_id, seq)`` (stored once). Use as a context
    manager or call :meth:`flush`.

    The first row fixes the schema (keys, per-row shapes and dtypes, as a buffer's first ``add`` does: a
    Python float is stored as ``torch.get_default_dtype()``); rows are copied into preallocated NumPy columns
    by the library's compiled row writer (~0.3 us a key for the plain form an env loop hands over: NumPy
    arrays, Python numbers, CPU tensors). Anything else is checked by the schema's full rules, cast and
    stored, or refused with a :class:`~objectrl_buffer.errors.SchemaError` naming the key. The columns of a
    batch on its way are kept until the shard acknowledges it (a retry sends them again), then reused: at
    most ``max_in_flight + 1`` sets exist.

    Threads may share a writer: its calls take turns on a lock (held while a call waits for room in flight,
    as that call would wait alone), so every row an ``add`` accepted is sent once, in one stream of seqs
    (the lock costs ~0.1-0.2 us an ``add``). A writer per thread never waits for another thread's send.

    A writer never forgets a row it accepted: when a shard stays unreachable past ``retry_timeout_s``, the call
    that found out raises :class:`~objectrl_buffer.errors.BufferUnavailable` and every batch not acknowledged
    is kept (counted by :attr:`undelivered` and the exception's ``undelivered_rows``); the next ``add``,
    :meth:`flush` or :meth:`close` sends them again first, in order (each stored once), and ``flush`` and
    ``close`` raise while any are left.

    ``flush_every_s`` is checked at each ``add`` (a writer that stops adding sends its pending rows at
    :meth:`flush` or on leaving its ``with`` block).

    Same node (``same_node`` not ``False``): when a shard runs on this process's Ray node, the column sets are
    files in a private folder (:attr:`folder`, in ``/dev/shm`` when all ``max_in_flight + 1`` sets take at most
    a quarter of its room, see :mod:`~objectrl_buffer.storage.placement`; else no files and every batch goes
    through Ray), and a batch bound for such a shard travels as a :class:`~.wire.SharedRows` descriptor: the
    shard copies the rows from its mapping of the files. A set is refilled only once its batch is acknowledged,
    so a batch retried after a shard restart still finds its rows there (the restarted shard maps the files
    anew). Batches bound for shards on other nodes travel through Ray as before. The folder goes at
    :meth:`close` (also on leaving the ``with`` block) or at process exit; the kernel-held lock in it lets the
    next writer's sweep remove it if this process is killed outright.
    """

    def __init__(
        self,
        remote: RemoteBuffer,
        batch_size: int,
        flush_every_s: float,
        max_in_flight: int,
        same_node: bool | None = None,
    ) -> None:
        self.remote = remote
        self.batch_size = positive_int(batch_size, "batch_size")
        self.flush_every_s = real_in(flush_every_s, "flush_every_s", 0.0, float("inf"))
        self.max_in_flight = positive_int(max_in_flight, "max_in_flight")
        if same_node not in (None, True, False):
            raise InvalidArgumentError(f"same_node must be None, True or False, got {same_node!r}")
        self.same_node = same_node
        #: the folder of this writer's column files (``None``: every batch travels through Ray)
        self.folder: str | None = None
        self.local: list[bool] = []  # per shard: on this process's node (batches as descriptors)
        self.sets = 0  # column sets made
        self._decided = same_node is False
        self._finalizer: weakref.finalize | None = None
        self.writer_id = uuid.uuid4().hex
        self.schema: Schema | None = None
        self.keys: frozenset[str] = frozenset()
        self.batch: _Columns | None = None  # the set being filled
        self.spare: list[_Columns] = []  # sets whose batches were acknowledged
        self.write_row: Callable[..., bool] = _declined  # the filled set's row writer
        self.filled = 0
        self.seq = 0
        #: ``(ref, shard, seq, batch or its SharedRows, admission, column set or None)`` of each batch not yet
        #: acknowledged.
        self.in_flight: deque[tuple[Any, int, int, Any, Any, _Columns | None]] = deque()
        #: batches in flight to a shard found down (degraded mode): set aside, not counted in ``max_in_flight``,
        #: settled once their shard answers again, before any later batch goes to it (see :meth:`_park`)
        self.parked: list[tuple[Any, int, int, Any, Any, _Columns | None]] = []
        self.deadline = time.monotonic() + self.flush_every_s
        #: held by each public call: threads sharing this writer take turns (its batches, sets and seqs are
        #: one stream; see the class docs)
        self._lock = threading.Lock()

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """The columns being filled (``{}`` before the first row)."""
        return {} if self.batch is None else self.batch.columns

    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> None:
        """Queue one transition (sent with the next batch).

        An earlier batch's refusal (a :class:`~objectrl_buffer.errors.SchemaError` from the shard, say) is
        raised by the add whose full batch could not be sent because of it; that add's row is queued all the
        same, and the batch goes with the next add or :meth:`flush`: no row is lost or added twice.

        Raises:
            InvalidArgumentError: its keys differ from the first row's. SchemaError: a value does not fit the
            first row's schema (named). Nothing is queued then.
        """
        lock = self._lock
        lock.acquire()  # not a with block: ~0.1 us less a row on CPython 3.11
        try:
            if self.filled >= self.batch_size:  # a full batch whose send failed: it goes first
                self._send()
            i = self.filled
            if not self.write_row(transition, i):
                self._add_checked(transition, i)
            self.filled = i + 1
            if self.filled >= self.batch_size or time.monotonic() >= self.deadline:
                self._send()
        except BufferUnavailable as exc:
            raise self._held(exc) from None
        finally:
            lock.release()

    def _add_checked(self, transition: TensorDictBase | Mapping[str, Any], i: int) -> None:
        """The rows the compiled writer declined: the schema's full check, then the copy (or the error)."""
        row = flat(transition)  # tensors kept: a 0-d float64 tensor fixes a float64 column, as in a buffer
        if self.schema is None:
            self.schema, _ = Schema.infer(row, batch_dims=0)
            self.keys = frozenset(str(field.key) for field in self.schema.fields)
        if self.batch is None:
            self.batch = self._new_set()
            self.write_row = self.batch.write_row
        if row.keys() - {INDEX_KEY} != self.keys:
            raise InvalidArgumentError(
                f"writer.add: keys {sorted(row)} differ from the first row's {sorted(self.keys)}"
            )
        pairs, _ = self.schema.check(row, batch_dims=0)
        assert self.batch is not None
        for field, value in pairs:  # checked and converted: the copy cannot fail halfway
            column = self.batch.columns[str(field.key)]
            column[i] = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> None:
        """Send a whole batch (after the single adds queued before it) without waiting for it to be stored:
        at most ``max_in_flight`` batches are on their way."""
        data = to_numpy(batch)
        with self._lock:
            try:
                self._send()
                self._dispatch(data, None)
            except BufferUnavailable as exc:
                raise self._held(exc) from None

    def _new_set(self) -> _Columns:
        """A fresh column set: in this writer's files when a shard shares its node, else plain memory."""
        assert self.schema is not None
        if not self._decided:
            self._open_folder()  # raises with same_node=True and no files: asked again at the next add
            self._decided = True
        if self.folder is not None:
            try:
                columns = _Columns(self.schema, self.batch_size, self.folder, self.sets)
                self.sets += 1
                return columns
            except OSError:
                if self.same_node:
                    raise
        return _Columns(self.schema, self.batch_size)

    def _open_folder(self) -> None:
        """Make this writer's folder if a shard shares its node and the sets fit (see the class docs)."""
        assert self.schema is not None
        ray = _ray()
        me = str(ray.get_runtime_context().get_node_id())
        self.local = [node == me for node in self.remote.node_ids()]
        row_bytes = sum(math.prod(f.shape) * _numpy_dtype(f.dtype).itemsize for f in self.schema.fields)
        need = (self.max_in_flight + 1) * self.batch_size * row_bytes
        parent = default_parent(need)
        why = None
        if not any(self.local):
            why = "no shard runs on this node"
        elif not row_bytes or not all(math.prod(f.shape) for f in self.schema.fields):
            why = "a column holds no bytes"
        elif parent != SHM_DIR and not is_tmpfs(parent):
            why = f"{need} bytes of column sets do not fit in {SHM_DIR}"
        if why is None:
            try:
                sweep_once(parent)
                prefix = writer_prefix(getattr(self.remote, "buffer_id", ""), self.writer_id)
                folder, fd = make_owned(parent, prefix)
            except OSError as exc:
                why = f"no folder in {parent}: {exc}"
            else:
                self._finalizer = weakref.finalize(self, _remove_folder, folder, fd)
                shards = [s for s, local in zip(self.remote.shards, self.local, strict=True) if local]
                sees = self.remote.retry("sees", lambda: [s.sees.remote(folder) for s in shards])
                seen = iter(sees)
                self.local = [local and next(seen) for local in self.local]
                if any(self.local):
                    self.folder = folder
                else:
                    self._finalizer()
                    self._finalizer = None
                    why = f"no shard on this node sees {folder}"
        if why is not None and self.same_node:
            raise InvalidArgumentError(f"writer(same_node=True): {why}")

    def _send(self) -> None:
        self.deadline = time.monotonic() + self.flush_every_s
        if not self.filled or self.batch is None or self.schema is None:
            return
        full, n = self.batch, self.filled
        self.batch, self.write_row, self.filled = None, _declined, 0
        try:  # sent first: the wait for room in flight frees a set to fill next (max_in_flight + 1 sets in all)
            self._dispatch(full.rows(n), full)
        except BaseException:  # not sent (an earlier batch's error): kept pending, sent by the next send
            self.batch, self.write_row, self.filled = full, full.write_row, n
            raise
        self.batch = self.spare.pop() if self.spare else self._new_set()
        self.write_row = self.batch.write_row

    def _dispatch(self, batch: dict[str, Any], columns: _Columns | None) -> None:
        # bounded (no refs pile up), and batches waiting to be sent again go first: a later seq stored before them
        # would make the shard take them for retries of applied writes
        while self.in_flight and (len(self.in_flight) >= self.max_in_flight or self.in_flight[0][0] is None):
            self._settle()
        remote = self.remote
        shard = remote.next_shard()
        if self.parked:
            self._unpark(shard)
        # asked again if the coordinator died; its ticket goes with the batch, also when sent again (see .tickets)
        admitted = remote.admit_insert(shard, batch_rows(batch, remote.num_envs), None)
        payload: dict[str, Any] | SharedRows = batch
        if columns is not None and columns.folder is not None and self.local[shard]:
            payload = columns.shared(len(next(iter(batch.values()))))  # the rows stay in the files
        entry = (None, shard, self.seq, payload, admitted, columns)
        self.in_flight.append((self._submit(entry), *entry[1:]))
        self.seq += 1

    def _submit(self, entry: tuple[Any, int, int, Any, Any, _Columns | None]) -> Any:
        _, shard, seq, batch, admitted, _ = entry
        return self.remote.shards[shard].add_batch.remote(batch, self.writer_id, seq, admitted)

    def _done(self) -> None:
        """The oldest batch is acknowledged (or refused): its columns may be filled again."""
        columns = self.in_flight.popleft()[5]
        if columns is not None:
            self.spare.append(columns)

    def _settle(self) -> None:
        """Wait for the oldest batch. If its shard died, wait out the restart and send it and every later
        batch again, in order (shards that stored one already acknowledge it without storing it twice).

        Raises:
            BufferUnavailable: the shard did not come back (see :meth:`RemoteBuffer.retry`): every batch in
                flight is kept, to be sent again by the next send (see :attr:`undelivered`).
        """
        ray = _ray()
        if self.in_flight[0][0] is None:  # kept after an earlier BufferUnavailable
            self._resend()
            return
        if self._park():
            return
        try:
            written = ray.get(self.in_flight[0][0])
        except ray.exceptions.RayActorError as exc:  # its shard died: set aside (degraded mode), else waited for
            if not self._set_aside(self.in_flight[0][1], f"a writer batch failed: {type(exc).__name__}"):
                self._resend()
            return
        except ray.exceptions.RayTaskError as exc:
            self._done()
            if isinstance(exc.cause, ReplayBufferError):
                raise exc.cause from None
            raise
        if written == MISSING:  # the shard does not see this writer's files: rows through Ray from now on
            self.local[self.in_flight[0][1]] = False
            self._resend()
            return
        self._done()

    def _park(self) -> bool:
        """Degraded mode (see :mod:`.health`): set the oldest batch aside if its shard has not answered within
        ``shard_timeout_s`` (see :meth:`_set_aside`); whether it was."""
        health = self.remote.health
        if not health.degrading or len(self.remote.shards) < 2:
            return False
        ref, shard = self.in_flight[0][0], self.in_flight[0][1]
        if _ray().wait([ref], timeout=health.shard_timeout_s)[0]:
            return False
        return self._set_aside(shard, f"a writer batch unanswered within shard_timeout_s={health.shard_timeout_s:g}")

    def _set_aside(self, shard: int, why: str) -> bool:
        """Degraded mode: mark ``shard`` down (later batches go to the other shards) and set its batches in flight
        aside, to be settled once it answers again; whether they were (not in ``"wait"`` mode or with one shard).

        A batch set aside is never sent to another shard (its own may have stored it before dying). At most
        ``max_in_flight`` a shard are set aside; past that the oldest is waited for."""
        health, shards = self.remote.health, self.remote.shards
        if not health.degrading or len(shards) < 2:
            return False
        health.mark_down(shard, why)
        # every batch of that shard is set aside, in order: a later one sent again (after the restart) before
        # an earlier one would make the shard take the earlier for a retry of an applied write and drop it
        self.parked.extend(entry for entry in self.in_flight if entry[1] == shard)
        self.in_flight = deque(entry for entry in self.in_flight if entry[1] != shard)
        if len(self.parked) > self.max_in_flight * len(shards):
            self._settle_parked(self.parked[0][1])
        return True

    def _unpark(self, shard: int) -> None:
        """Settle the batches set aside for ``shard`` (the next batch goes there; waits for them) and those of
        shards that answer again (never waits for a shard still down)."""
        live = set(self.remote.health.live(self.remote.shards))
        for s in sorted({entry[1] for entry in self.parked}):
            if s == shard or s in live:
                self._settle_parked(s)

    def _settle_parked(self, shard: int) -> None:
        """Settle the batches set aside for ``shard``, in order: acknowledged, or sent to it again once it is
        back (stored once). Raises as :meth:`_settle`; what is not settled stays set aside."""
        ray = _ray()
        while True:
            mine = [entry for entry in self.parked if entry[1] == shard]
            if not mine:
                return
            entry = mine[0]
            written: Any = MISSING
            if entry[0] is not None:
                try:
                    written = ray.get(entry[0])
                except ray.exceptions.RayActorError:
                    pass
                except ray.exceptions.RayTaskError as exc:
                    self._unparked(entry)
                    if isinstance(exc.cause, ReplayBufferError):
                        raise exc.cause from None
                    raise
                if written == MISSING and entry[0] is not None and isinstance(entry[3], SharedRows):
                    self.local[shard] = False
            if written == MISSING:  # died with its shard, or kept after an earlier error: sent again, in order
                index = self.parked.index(entry)
                self.parked[index] = (None, *entry[1:])
                again = self._as_rows(self.parked[index])
                while self.remote.retry("writer batch", functools.partial(self._submit, again), shard=shard) == MISSING:
                    self.local[shard] = False
                    again = self._as_rows(again)
                entry = self.parked[index]
            self._unparked(entry)

    def _unparked(self, entry: tuple[Any, int, int, Any, Any, _Columns | None]) -> None:
        self.parked.remove(entry)
        if entry[5] is not None:
            self.spare.append(entry[5])

    def _resend(self) -> None:
        """Send every batch in flight again, in order, once the oldest is stored (see :meth:`_settle`)."""
        old = [(None, *entry[1:]) for entry in self.in_flight]
        self.in_flight = deque(old)  # kept as they are until the first is stored (see undelivered)
        try:
            while True:
                old = [self._as_rows(entry) for entry in old]
                self.in_flight = deque(old)
                if self.remote.retry("writer batch", functools.partial(self._submit, old[0])) != MISSING:
                    break
                self.local[old[0][1]] = False  # restarted where the files are not
        except BufferUnavailable:  # all kept; counted by the public call (_held)
            raise
        except BaseException:  # the first batch refused (or interrupted): the later ones go with the next send
            self._done()
            raise
        self.in_flight = deque((self._submit(entry), *entry[1:]) for entry in old[1:])
        if old[0][5] is not None:
            self.spare.append(old[0][5])

    def _held(self, exc: BufferUnavailable) -> BufferUnavailable:
        """``exc`` with the count of rows this writer holds undelivered (what a public call raises)."""
        undelivered = self.undelivered
        error = BufferUnavailable(
            f"{str(exc).splitlines()[0]} ... this writer holds {undelivered} rows it accepted and could not deliver "
            "(writer.undelivered): its next add, flush or close sends them again, each stored once"
        )
        error.undelivered_rows = undelivered
        return error

    @property
    def undelivered(self) -> int:
        """Rows this writer accepted (``add``, ``add_batch``) that no shard has acknowledged yet: queued, on their
        way, or kept after a :class:`~objectrl_buffer.errors.BufferUnavailable` to be sent again. ``0`` after a
        :meth:`flush` or :meth:`close` that returned."""
        rows = self.filled
        for entry in [*self.in_flight, *self.parked]:
            payload = entry[3]
            rows += payload.rows if isinstance(payload, SharedRows) else batch_rows(payload, self.remote.num_envs)
        return rows

    def _as_rows(self, entry: tuple[Any, int, int, Any, Any, _Columns | None]) -> tuple[Any, ...]:
        """``entry`` with its rows instead of a descriptor when its shard no longer sees this writer's files."""
        payload, columns = entry[3], entry[5]
        if isinstance(payload, SharedRows) and columns is not None and not self.local[entry[1]]:
            return (*entry[:3], columns.rows(payload.rows), *entry[4:])
        return entry

    def flush(self) -> None:
        """Send what is pending and wait until every batch is stored.

        Raises:
            BufferUnavailable: a shard stayed unreachable; the rows not delivered are kept (:attr:`undelivered`,
                also the exception's ``undelivered_rows``) and sent again by the next ``add``, ``flush`` or
                ``close``. Anything a shard refused (as ``add``).
        """
        with self._lock:
            try:
                self._flush()
            except BufferUnavailable as exc:
                raise self._held(exc) from None

    def _flush(self) -> None:
        self._send()
        while self.in_flight:
            self._settle()
        while self.parked:
            self._settle_parked(self.parked[0][1])

    def close(self) -> None:
        """:meth:`flush`, then let the shards drop their mappings of this writer's files and remove them.
        The writer stays usable, its later batches through Ray.

        Raises:
            BufferUnavailable: as :meth:`flush`; the writer's files and undelivered rows are kept for a later
                ``close`` (or until the process exits).
        """
        with self._lock:
            try:
                self._close()
            except BufferUnavailable as exc:
                raise self._held(exc) from None

    def _close(self) -> None:
        self._flush()  # raises while rows are undelivered: they, and the files they are in, are kept
        if self._finalizer is not None:
            ray = _ray()
            shards = [s for s, local in zip(self.remote.shards, self.local, strict=True) if local]
            with contextlib.suppress(ray.exceptions.RayError):  # a dead shard holds no mapping
                ray.get([s.release.remote(self.writer_id) for s in shards])
            self._finalizer()
            self._finalizer, self.folder = None, None
            self.batch, self.spare, self.write_row, self.filled = None, [], _declined, 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
