"""Allocate a fresh storage's RAM-backed pages ahead of its writer, off the writer's thread.

Why: the first write of a row into a fresh RAM-backed file (``/dev/shm``) costs the kernel's page
allocation as well as the copy. A ``write_fresh`` storage
(:class:`~objectrl_buffer.storage.table.TransitionStorage`) copies with ``os.pwrite``, which allocates
each page as it copies into it (~3.8 ms per 13 MB on a 2-core VM); into pages that ``posix_fallocate``
already allocated, the same ``pwrite`` only copies (~2.5 ms). So a writer that fills storages one after
another (the trajectory room's unbounded chunks) prepares the next one on another thread with
:func:`preallocate` while it fills the current one.

The storage's own bookkeeping is left alone: its ``reserved`` rows do not move, so its writes keep taking
the ``pwrite`` path (``pwrite`` into an allocated page does not fault it in or zero it, unlike a store
through the mapping), and a failed allocation (a full ``/dev/shm``) changes nothing: the writes then
allocate, or move the storage, as they would have.
"""

from __future__ import annotations

import os

from objectrl_buffer.storage import placement, torchrl_compat
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["preallocate"]


def preallocate(storage: TransitionStorage) -> bool:
    """Allocate every page of the initialized CPU ``storage``'s column files (``posix_fallocate``), if they
    are RAM-backed. Nothing is written or mapped. Returns whether it did; ``False`` (not initialized, not
    on the CPU, on disk, or the file system is full) leaves the storage as it was for all its uses.

    Call it only before the storage's first write, or from the thread that writes it (the kernel serializes
    ``fallocate`` and ``pwrite`` of one file, so concurrent calls only wait on each other).
    """
    schema, folder = storage.schema, storage.folder
    if schema is None or storage.device.type != "cpu" or folder is None or not placement.is_tmpfs(folder):
        return False
    stored = torchrl_compat.stored_tensordict(storage.torchrl)
    if stored is None:
        return False
    items: list[str | tuple[str, int, int]] = []
    for field in schema.fields:
        path = getattr(stored.get(field.key), "filename", None)
        if path and os.path.exists(path) and field.row_bytes:
            items.append((path, 0, field.row_bytes * storage.capacity))
    try:
        placement.reserve(items, workers=1)
    except OSError:
        return False
    return bool(items)
