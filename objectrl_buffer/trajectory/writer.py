"""The background writer that keeps an RLinf folder (:mod:`~objectrl_buffer.trajectory.files`) up to date.

Trajectory files are written in the order they were added; the index and metadata are rewritten only after
the files they name exist, so the folder loads after a kill at any moment, holding a prefix of what was added.
A file the published index names is never overwritten (ids restart at 0 after a clear or a load): the index is
republished without it first. Each index entry records its file's size and crc32.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Any

import torch

from objectrl_buffer.core.sync import hold_folder
from objectrl_buffer.errors import CheckpointError
from objectrl_buffer.trajectory import files
from objectrl_buffer.trajectory.files import Entry

__all__ = ["TrajectoryWriter", "PUBLISH_INTERVAL", "MAX_PENDING_BYTES"]

#: While trajectories keep arriving, the index is rewritten at least this often (seconds), or, for a large
#: index, after 10x the time its last rewrite took (so rewrites cost at most ~10% of the writer's time).
PUBLISH_INTERVAL = 0.1
#: Bytes of trajectories queued for the writer at most; an add past it waits (memory stays bounded).
MAX_PENDING_BYTES = 1 << 30


class TrajectoryWriter:
    """One background thread that persists trajectories to an RLinf folder, in the order they were added.

    Work items are processed in order; when the queue runs empty, and at least every
    :data:`PUBLISH_INTERVAL` seconds while it does not, the index and the metadata are rewritten to name
    exactly the trajectories whose files are complete. At most :data:`MAX_PENDING_BYTES` of trajectories
    wait in the queue: a :meth:`submit` beyond that blocks until the thread catches up. A failure is kept
    and raised (as :class:`CheckpointError`) by the next :meth:`submit`, :meth:`flush` or :meth:`close`.
    """

    def __init__(
        self, folder: str, fmt: str, seed: Any, entries: list[Entry] | None = None, *, publish: bool = True
    ) -> None:
        """``entries``: what ``folder``'s index names already. ``publish=False``: the folder has an index
        naming ``entries`` (a resumed folder), left as it is until there is something to change."""
        self.folder = folder
        self.fmt = fmt
        self.seed = seed
        self.entries: list[Entry] = list(entries or [])  # the index to publish next (writer thread only)
        self._named = {self._path(e) for e in self.entries}  # files the published index names
        self._doomed: list[str] = []  # files of dropped trajectories, deleted once the index no longer names them
        self._unsynced: list[str] = []  # files written since the last index, synced just before the next
        self._dirty = False
        self._published = time.monotonic()
        self._publish_cost = 0.0  # seconds the last index rewrite took
        self._pending = 0  # bytes queued, guarded by _room
        self._room = threading.Condition()
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.closed = False
        os.makedirs(folder, exist_ok=True)
        # marks the folder in use while the thread runs (the kernel drops it if the process dies): a
        # save_checkpoint of another buffer into it refuses, instead of swapping the folder away under us
        self._hold = hold_folder(folder)
        if publish:
            self._publish()  # before any trajectory lands, the folder already loads
        self._thread = threading.Thread(target=self._run, name="objectrl_buffer-trajectory-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side
    def raise_error(self) -> None:
        """Raise the writer thread's failure, if it had one."""
        if self.error is not None:
            raise CheckpointError(f"writing trajectories to '{self.folder}' failed: {self.error}") from self.error

    def submit(self, entry: Entry, payload: dict[str, Any]) -> None:
        """Queue a trajectory file (``payload`` must not be changed afterwards)."""
        self.raise_error()
        nbytes = _nbytes(payload)
        with self._room:
            # one trajectory larger than the limit still goes through, alone
            self._room.wait_for(lambda: self._pending == 0 or self._pending + nbytes <= MAX_PENDING_BYTES)
            self._pending += nbytes
        self._queue.put(("write", (entry, payload, nbytes)))

    def drop(self, ids: list[int]) -> None:
        """Queue the removal of evicted trajectories: out of the index first, then their files."""
        self._queue.put(("drop", set(ids)))

    def reset(self, entries: list[Entry]) -> None:
        """Queue: the folder now holds exactly ``entries`` (their files exist already), e.g. after a clear or load."""
        self._queue.put(("reset", list(entries)))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is on disk and indexed. Raises ``TimeoutError`` after ``timeout`` s."""
        done = threading.Event()
        self._queue.put(("flush", done))
        if not done.wait(timeout):
            raise TimeoutError(f"the trajectory writer did not finish within {timeout} s")
        self.raise_error()

    def close(self, wait: bool = True) -> None:
        """Stop the thread after the queued work (idempotent); with ``wait``, wait for it and raise its failure."""
        if not self.closed:
            self.closed = True
            self._queue.put(None)
        if wait:
            self._thread.join()
            self.raise_error()

    # ------------------------------------------------------------------ writer thread
    def _path(self, entry: Entry) -> str:
        return os.path.join(self.folder, files.file_name(entry.trajectory_id, entry.model_weights_id, self.fmt))

    def _release(self, nbytes: int) -> None:
        with self._room:
            self._pending -= nbytes
            self._room.notify_all()

    def _publish(self) -> None:
        start = time.monotonic()
        unsynced, self._unsynced = self._unsynced, []
        files.sync_files(self.folder, unsynced)  # durable before the index names them
        files.write_index(self.folder, self.entries, self.fmt, self.seed)
        self._named = {self._path(e) for e in self.entries}
        self._published = time.monotonic()
        self._publish_cost = self._published - start
        doomed, self._doomed = self._doomed, []
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._dirty = False

    def _step(self, op: str, arg: Any) -> None:
        if op == "write":
            entry, payload, nbytes = arg
            try:
                path = self._path(entry)
                if path in self._named:  # the published index names a file of this name (ids restarted)
                    self._publish()  # which no longer names it (self.entries cannot: ids are unique)
                if path in self._doomed:  # an evicted, not yet deleted file of the same name
                    self._doomed.remove(path)
                nbytes, crc = files.write_payload(path, payload, self.fmt, durable=False)
                self._unsynced.append(path)
                self.entries.append(entry.with_file(nbytes, crc))
            finally:
                self._release(nbytes)
        elif op == "drop":
            kept = [e for e in self.entries if e.trajectory_id not in arg]
            gone = [e for e in self.entries if e.trajectory_id in arg]
            self._doomed += [self._path(e) for e in gone]
            self.entries = kept
        elif op == "reset":
            self.entries = arg
        self._dirty = True

    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                self._publish_safely()
                os.close(self._hold)
                return
            op, arg = item
            if op == "flush":
                self._publish_safely()
                arg.set()
                continue
            if self.error is None:
                try:
                    self._step(op, arg)
                except BaseException as exc:  # kept for the caller; later work is skipped
                    self.error = exc
            elif op == "write":
                self._release(arg[2])
            if q.empty() or time.monotonic() - self._published > max(PUBLISH_INTERVAL, 10 * self._publish_cost):
                self._publish_safely()

    def _publish_safely(self) -> None:
        if self.error is None and self._dirty:
            try:
                self._publish()
            except BaseException as exc:
                self.error = exc


def _nbytes(value: Any) -> int:
    """Bytes of the tensors in a payload (nested dicts included)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0
