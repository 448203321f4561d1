"""A task storage every process sees: rows appended to files under one folder, under a lock the kernel
releases on death, each batch made visible by fixed-size commit records written after its bytes.

Files in the folder:

* ``rows.data``: the encoded rows (:func:`~objectrl_buffer.tasks.codec.encode_row`: JSON + raw tensor bytes),
  back to back.
* ``rows.index``: one 44-byte record per row/eviction: ``kind, more, offset, length, task hash, crc32 of the
  bytes, crc32 of the record``. ``more`` counts the records still to come in the same store, so a reader
  takes a store only once its last record is there: a writer SIGKILLed mid-store leaves nothing visible.
* ``tasks.json``: the capacity, fixed when the folder is made.

Writers hold ``lock_file(<folder>/lock)`` (``flock``: a killed holder releases it) while they read the new
records' task hashes (not the rows) to plan evictions, cut off whatever a killed writer left past the last
committed store, and append. Readers take no lock: each process keeps a :class:`TaskTable` mirror and decodes
only the records committed since its last read. Evicted rows stay in the files (they grow with every row
ever stored; a fresh folder, or ``save``/``load``, starts compact).

The folder's files are opened only if they are regular files (never through a symbolic link, never waiting
on a FIFO), and whatever they hold is checked before use: a forged or corrupt file raises
:class:`~objectrl_buffer.errors.CheckpointError` naming it, allocating no more than the file's own size.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import struct
import weakref
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from objectrl_buffer.checkpoint.io import atomic_write, open_regular, read_small_file
from objectrl_buffer.core.group_fifo import GroupCounts, plan_store
from objectrl_buffer.core.sync import lock_file
from objectrl_buffer.core.validate import folder, positive_int
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from objectrl_buffer.storage import shm_files

from ..codec import decode_row, encode_row
from ..rows import DataRow, normalize_row, row_list
from ..table import TaskTable
from .base import TableStorage

__all__ = ["SharedTaskStorage"]

_RECORD = struct.Struct("<IHHIQQQI")  # magic, kind, pad, more, offset, length, task hash, crc32 of bytes
_SIZE = _RECORD.size + 4  # + crc32 of the record itself
_MAGIC = 0x4B534154  # "TASK"
_ROW, _EVICT, _CLEAR = 1, 2, 3
_SETTINGS_LIMIT = 1 << 16


def task_hash(task_id: str) -> int:
    """A stable 64-bit key of a task_id (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child dropping its copy must not delete the parent's folder
        shutil.rmtree(folder, ignore_errors=True)


class SharedTaskStorage(TableStorage):
    """Task rows shared by processes (``spawn``, ``fork`` or ``forkserver``): pass the storage (or the buffer
    holding it) to ``multiprocessing.Process``; every process stores and reads the same rows.

    Args:
        max_capacity: rows held at most; whole oldest tasks are evicted first (as :class:`InMemoryStorage`).
            A folder keeps the capacity it was made with; opening it with another raises.
        path: the folder (made if missing; reopened with its rows if it exists). ``None``: a temporary folder,
            removed when the storage that made it is garbage collected in the process that made it.
    """

    def __init__(self, max_capacity: int = 10000, path: str | os.PathLike[str] | None = None) -> None:
        self.max_capacity = positive_int(max_capacity, "max_capacity")
        self._owned = path is None
        # a temporary folder is named after this process (see objectrl-buffer clean)
        self.path = shm_files.new_folder(shm_files.TASKS_PREFIX) if path is None else folder(path, "path")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create the task storage folder '{self.path}': {exc.strerror or exc}"
            ) from exc
        with self._locked():
            held = self._settings()
            if held is None:  # a new folder: its files, then the settings that say it is complete
                for name in ("rows.data", "rows.index"):
                    os.close(self._open_file(name))
                settings = {"format": "objectrl_buffer.tasks/1", "max_capacity": self.max_capacity}
                atomic_write(self._file("tasks.json"), functools.partial(_write_json, value=settings))
            elif held != self.max_capacity:
                raise InvalidArgumentError(
                    f"'{self.path}' holds a task storage of max_capacity={held}, not max_capacity={max_capacity}"
                )
        if self._owned:
            weakref.finalize(self, _remove_folder, self.path, os.getpid())
        self._open()

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _settings(self) -> int | None:
        """The capacity ``tasks.json`` records (``None`` when there is no such file yet)."""
        where = self._file("tasks.json")
        try:
            settings = json.loads(read_small_file(where, _SETTINGS_LIMIT))
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(f"'{where}' is not valid JSON: {str(exc)[:200]}") from None
        held = settings.get("max_capacity") if isinstance(settings, dict) else None
        if type(held) is not int or held < 1:
            raise CheckpointError(f"'{where}' is not a task storage's settings (no positive int max_capacity)")
        return held

    def _open_file(self, name: str) -> int:
        """A read-write descriptor of the folder's file ``name`` (created if missing), a regular file only."""
        where = self._file(name)
        try:
            return open_regular(where, writable=True)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"the task storage folder '{self.path}' is gone") from None
        except OSError as exc:
            raise CheckpointError(f"cannot open '{where}': {exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the writers' lock, ``<folder>/lock`` (an ``flock`` the kernel releases if the holder dies)."""
        lock = self._file("lock")
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(lock_file(lock))
            except OSError as exc:
                raise CheckpointError(f"cannot lock '{lock}': {exc.strerror or exc}") from exc
            yield

    def _open(self) -> None:
        self._pid = os.getpid()
        self._data_fd = self._open_file("rows.data")
        try:
            self._index_fd = self._open_file("rows.index")
        except BaseException:
            os.close(self._data_fd)
            raise
        # what this process's writes know: records read, bytes committed, rows per task hash
        self._w_records = 0
        self._w_end = 0
        self._w_counts = GroupCounts()
        # what this process's reads know (decoded rows)
        self._mirror = TaskTable()
        self._mirror_names: dict[int, str] = {}  # task hash -> task_id of the tasks the mirror holds
        self._r_records = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"max_capacity": self.max_capacity, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_capacity, self.path, self._owned = state["max_capacity"], state["path"], False
        self._open()

    def _check_pid(self) -> None:
        if os.getpid() != self._pid:  # forked: own descriptors and offsets, same folder
            self._open()

    def close(self) -> None:
        """Close this process's file descriptors (the rows stay in the folder)."""
        for fd in (self._data_fd, self._index_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- reading the commit records --
    def _records(self, start: int) -> list[tuple[int, int, int, int, int, int]]:
        """Valid records from ``start`` up to the last one that ends a store: ``(kind, more, offset, length,
        hash, crc)`` each. Stops at the first torn or foreign record (a killed writer's)."""
        size = os.fstat(self._index_fd).st_size
        count = size // _SIZE - start
        if count <= 0:
            return []
        raw = os.pread(self._index_fd, count * _SIZE, start * _SIZE)  # at most the index file's size
        out: list[tuple[int, int, int, int, int, int]] = []
        committed = 0
        for i in range(len(raw) // _SIZE):
            chunk = raw[i * _SIZE : (i + 1) * _SIZE]
            (crc,) = struct.unpack_from("<I", chunk, _RECORD.size)
            if zlib.crc32(chunk[: _RECORD.size]) != crc:
                break
            magic, kind, _, more, offset, length, key, data_crc = _RECORD.unpack_from(chunk)
            if magic != _MAGIC:
                break
            out.append((kind, more, offset, length, key, data_crc))
            if more == 0:
                committed = len(out)
        out = out[:committed]
        data_size = os.fstat(self._data_fd).st_size  # after the records: their bytes were written before them
        for n, (kind, _, offset, length, _, _) in enumerate(out, start):
            if kind not in (_ROW, _EVICT, _CLEAR):
                raise CheckpointError(f"'{self._file('rows.index')}' record {n} has the unknown kind {kind}")
            if offset + length > data_size:
                raise CheckpointError(
                    f"'{self._file('rows.index')}' record {n} declares bytes [{offset}, {offset + length}) "
                    f"past the end of '{self._file('rows.data')}' ({data_size} bytes)"
                )
        return out

    def _table(self) -> TaskTable:
        """This process's mirror, brought up to date with every committed store."""
        self._check_pid()
        records = self._records(self._r_records)
        if not records:
            return self._mirror
        first = min(r[2] for r in records)
        last = max(r[2] + r[3] for r in records)
        blob = memoryview(os.pread(self._data_fd, last - first, first))
        table = self._mirror
        pending: list[DataRow] = []
        values: list[tuple[object, ...]] = []

        def flush() -> None:
            table.append(pending, values)
            task_ids = [r.exp_meta.task_id for r in pending]
            table.note_appended(task_ids)
            self._mirror_names.update((task_hash(t), t) for t in set(task_ids))
            pending.clear()
            values.clear()

        # every row decoded and checked before the mirror changes: a bad one changes nothing
        decoded: list[tuple[int, int, tuple[DataRow, tuple[Any, ...]] | None]] = []
        for kind, _, offset, length, key, data_crc in records:
            payload = blob[offset - first : offset - first + length]
            if zlib.crc32(payload) != data_crc:
                raise CheckpointError(f"'{self._file('rows.data')}' is corrupt at byte {offset} (crc32 mismatch)")
            if kind != _ROW:
                decoded.append((kind, key, None))
                continue
            try:
                decoded.append((kind, key, normalize_row(decode_row(payload))))
            except (ValueError, TypeError, RecursionError) as exc:
                where = self._file("rows.data")
                raise CheckpointError(f"'{where}' holds a malformed row at byte {offset}: {str(exc)[:300]}") from exc
        for kind, key, found in decoded:
            if found is not None:
                pending.append(found[0])
                values.append(found[1])
                continue
            flush()
            if kind == _EVICT and key in self._mirror_names:
                table.remove_tasks([self._mirror_names.pop(key)])
            elif kind == _CLEAR:
                table.clear()
                self._mirror_names.clear()
        flush()
        self._r_records += len(records)
        return table

    # -- writes --
    def _catch_up(self) -> None:
        """Under the lock: fold new records into the write bookkeeping; cut a killed writer's leftovers."""
        records = self._records(self._w_records)
        counts = self._w_counts
        for kind, _, offset, length, key, _ in records:
            if kind == _ROW:
                counts.rows[key] = counts.rows.get(key, 0) + 1
                counts.total += 1
            elif kind == _EVICT:
                counts.total -= counts.rows.pop(key, 0)
            else:
                self._w_counts = counts = GroupCounts()
            self._w_end = offset + length
        self._w_records += len(records)
        if os.fstat(self._index_fd).st_size > self._w_records * _SIZE:
            os.ftruncate(self._index_fd, self._w_records * _SIZE)
        if os.fstat(self._data_fd).st_size > self._w_end:
            os.ftruncate(self._data_fd, self._w_end)

    def _append(self, entries: list[tuple[int, int, bytes]]) -> None:
        """Under the lock: write the bytes, then the records (the last with ``more == 0``)."""
        records = []
        offset = self._w_end
        for i, (kind, key, payload) in enumerate(entries):
            head = _RECORD.pack(_MAGIC, kind, 0, len(entries) - 1 - i, offset, len(payload), key, zlib.crc32(payload))
            records.append(head + struct.pack("<I", zlib.crc32(head)))
            offset += len(payload)
        _pwrite_all(self._data_fd, b"".join(p for _, _, p in entries), self._w_end)
        _pwrite_all(self._index_fd, b"".join(records), self._w_records * _SIZE)
        self._w_records += len(entries)
        self._w_end = offset

    def add(self, data: DataRow) -> None:
        self.add_batch([data])

    def add_batch(self, data_batch: Sequence[DataRow]) -> None:
        """Store rows in order (all or nothing on bad input; see :class:`InMemoryStorage` for the errors)."""
        self._check_pid()
        stored, _ = TaskTable.prepare(row_list(data_batch))
        if not stored:
            return
        keys = [task_hash(r.exp_meta.task_id) for r in stored]
        names = {k: r.exp_meta.task_id for k, r in zip(keys, stored, strict=False)}
        encoded = [encode_row(r) for r in stored]  # before the lock: the lock is held only to append
        with self._locked():
            self._catch_up()
            plan = plan_store(self._w_counts, keys, self.max_capacity, name=lambda k: repr(names.get(k, k)))  # type: ignore[call-overload]
            entries: list[tuple[int, int, bytes]]
            entries = [(_EVICT, int(key), b"") for key in plan.evicted]  # type: ignore[call-overload]
            entries += [(_ROW, k, p) for k, p, keep in zip(keys, encoded, plan.keep, strict=False) if keep]
            self._append(entries)
            self._w_counts = plan.apply()

    def clear(self) -> None:
        self.replace_table(TaskTable())

    def replace_table(self, table: TaskTable) -> None:
        """Hold exactly ``table``'s rows, in one store (other processes never see a half-replaced buffer)."""
        self._check_pid()
        if table.n > self.max_capacity:
            raise InvalidArgumentError(f"{table.n} rows do not fit max_capacity={self.max_capacity}")
        encoded = [(task_hash(r.exp_meta.task_id), encode_row(r)) for r in table.each_row()]
        keys = [k for k, _ in encoded]
        entries = [(_CLEAR, 0, b""), *((_ROW, k, payload) for k, payload in encoded)]
        with self._locked():
            self._catch_up()
            self._append(entries)
            self._w_counts = plan_store(GroupCounts(), keys, self.max_capacity).after


def _write_json(f: BinaryIO, value: Any) -> None:
    f.write(json.dumps(value).encode())


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
