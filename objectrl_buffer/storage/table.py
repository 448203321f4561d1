"""Where rows live: a torchrl storage on the storing device, and cheap per-key access to it.

* CPU: torchrl ``LazyMemmapStorage`` with its files in a private folder, made in ``storage_dir`` when
  the user names one. Otherwise :mod:`~objectrl_buffer.storage.placement` picks the parent when the row size
  is known (first write): ``/dev/shm`` if the whole buffer fits there with room to spare (its pages are
  then reserved up front), the disk-backed temp folder if not, so a 64 MB ``/dev/shm`` never stops it.
* Any other device (CUDA, MPS, ...): torchrl ``LazyTensorStorage`` on that device.

torchrl allocates the storage on the first write and owns its layout. After that we keep a plain
``torch.Tensor`` view of each key ("columns") and write rows into them with slice assignment, and
read rows with ``index_select``. Why not torchrl's own ``set``/``get``: those go through TensorDict
indexing and cost ~200 us per single-row write and ~300 us per 256-row read on a 2-core CPU, where a
column write or gather costs ~2-10 us per key (see ``benchmarks/``).

On the CPU the same memory is also viewed as NumPy arrays (``arrays``): ``ndarray.take`` gathers 256
rows ~1.5x faster than ``index_select``, a contiguous slice copies ~2x faster than ``Tensor.clone``,
and :class:`~objectrl_buffer.storage.fast_write.FastWriter` writes single rows through them.

:meth:`TransitionStorage.release` frees the memory deterministically (drops the only reference to the
memmaps and unlinks their files), so a buffer that is reset 10,000 times holds a constant number of
open files and bytes: the same torchrl storage object is reused, only its contents are dropped.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
import weakref
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, LazyTensorStorage
from torchrl.data.replay_buffers.storages import TensorStorage

from objectrl_buffer.core.schema import Key, Schema
from objectrl_buffer.errors import ClosedBufferError
from objectrl_buffer.storage import placement
from objectrl_buffer.storage.fast_write import FastWriter, numpy_views
from objectrl_buffer.storage.prefault import populate_all

__all__ = ["TransitionStorage", "make_tensordict"]


def _remove_folders(folders: list[str]) -> None:
    """Remove every folder in ``folders`` (at close, or at exit for a storage never closed)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    folders.clear()


def make_tensordict(values: dict[Key, torch.Tensor], batch_size: torch.Size, device: torch.device | None) -> TensorDict:
    """A TensorDict of freshly gathered tensors (all already on ``device``), without re-checking them.

    ``TensorDict._new_unsafe`` skips the per-key shape/device validation of the public constructor
    (~20 us per 256-row sample): the tensors were just produced with the right shapes and device.
    """
    source: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(key, str):
            source[key] = value
            continue
        node = source
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)


class TransitionStorage:
    """Fixed-capacity rows of one schema on one device.

    Args:
        capacity: number of rows (slots), > 0.
        device: the storing device. CPU gives memory-mapped files, anything else device tensors.
        directory: parent folder for the CPU memmap files, where a private sub-folder is created at
            once. ``None``: :mod:`~objectrl_buffer.storage.placement` chooses the parent at the first
            :meth:`initialize`. The sub-folder is removed by :meth:`close` (or at exit).
    """

    def __init__(self, capacity: int, device: torch.device, directory: str | os.PathLike[str] | None = None) -> None:
        self.capacity = capacity
        self.device = device
        self.schema: Schema | None = None
        self.columns: dict[Key, torch.Tensor] = {}
        self.arrays: dict[Key, np.ndarray] | None = None  # NumPy views of the CPU columns
        self.fast: FastWriter | None = None  # per-schema fast path of add/add_batch (CPU only)
        self.folder: str | None = None
        self._parent = os.fspath(directory) if directory is not None else None  # None: placement decides
        self._folders: list[str] = []  # every private folder made, removed by close() or at exit
        self.closed = False
        self.torchrl: TensorStorage
        if device.type == "cpu":
            self.torchrl = LazyMemmapStorage(capacity, existsok=True, auto_cleanup=False)
            self._finalizer = weakref.finalize(self, _remove_folders, self._folders)
            if self._parent is not None:
                self._make_folder(self._parent)
        else:
            self.torchrl = LazyTensorStorage(capacity, device=device)

    def _make_folder(self, parent: str) -> None:
        """Create this storage's private folder in ``parent`` and point torchrl at it."""
        os.makedirs(parent, exist_ok=True)
        self.folder = tempfile.mkdtemp(prefix="objectrl_buffer-", dir=parent)
        self._folders.append(self.folder)
        assert isinstance(self.torchrl, LazyMemmapStorage)
        self.torchrl.scratch_dir = self.folder + os.sep

    def _place(self, nbytes: int) -> None:
        """Without a user ``storage_dir``: move the (empty) private folder to where ``nbytes`` belong."""
        if self._parent is not None:
            return
        parent = placement.default_parent(nbytes)
        if self.folder is not None and os.path.dirname(self.folder) == parent:
            return
        self._remove_folder()
        try:
            self._make_folder(parent)
        except OSError:  # e.g. a read-only /dev/shm, or one out of inodes
            if parent == tempfile.gettempdir():
                raise
            self._make_folder(tempfile.gettempdir())

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.folder in self._folders:
                self._folders.remove(self.folder)
            self.folder = None

    def _reserve(self, stored: TensorDictBase, schema: Schema) -> bool:
        """Reserve every byte of the column files (tensordict makes none for an empty column)."""
        names = [getattr(stored.get(f.key), "filename", None) for f in schema.fields]
        try:
            placement.reserve(name for name in names if name and os.path.exists(name))
        except OSError:
            return False
        return True

    # ------------------------------------------------------------------ lifecycle
    @property
    def initialized(self) -> bool:
        """Whether a schema has been fixed and memory allocated."""
        return self.schema is not None

    def initialize(self, schema: Schema, first_row: dict[Key, torch.Tensor], *, populate: bool = True) -> None:
        """Allocate ``capacity`` rows of ``schema`` through torchrl, from one example row.

        Placed in RAM by default (``/dev/shm``, or a temp folder that is a tmpfs; see
        :mod:`~objectrl_buffer.storage.placement`), the files are reserved in full, and with ``populate`` also
        mapped into this process at once, so that no later write or read of a row takes a page fault (a
        loader that fills the pages itself passes ``False``). Warns (``RuntimeWarning``) when RAM-backed
        files could not be reserved anywhere.

        Raises:
            ClosedBufferError: after :meth:`close`.
            OSError: the memmap files cannot be created.
        """
        if self.closed:
            raise ClosedBufferError("this buffer was closed: its storage is freed and cannot take rows again")
        example = make_tensordict(first_row, torch.Size([]), None).to(self.device)
        if self.device.type == "cpu":
            self._place(schema.row_bytes * self.capacity)
        stored = self._allocate(example)
        reserved = False
        if self._parent is None and self.folder is not None and self._in_ram():
            reserved = self._reserve(stored, schema)
            if not reserved and os.path.dirname(self.folder) != tempfile.gettempdir():
                # /dev/shm filled up since the check: to the temp folder, before any row is written
                del stored
                self.release()
                self._remove_folder()
                self._make_folder(tempfile.gettempdir())
                stored = self._allocate(example)
                reserved = self._in_ram() and self._reserve(stored, schema)
            if not reserved and self._in_ram():
                warnings.warn(
                    f"the replay buffer's {schema.row_bytes * self.capacity / 2**30:.2f} GiB could not be "
                    f"reserved in '{self.folder}', a RAM-backed folder: writes may kill the process (SIGBUS) "
                    "if it fills up. Pass storage_dir= a folder on disk.",
                    RuntimeWarning,
                    stacklevel=4,
                )
        # Plain-tensor views: indexing the MemoryMappedTensor subclass costs an extra dispatch per call.
        self.columns = {f.key: stored.get(f.key).as_subclass(torch.Tensor) for f in schema.fields}
        if self.device.type == "cpu":
            if reserved and populate:
                populate_all(list(self.columns.values()))
            self.arrays = numpy_views(self.columns)
            # Disk-backed files take wide rows through pwrite (see fastpath.WIDE_ROW_BYTES); reserved RAM
            # is never written back, so its mapped pages stay writable and plain stores are cheaper.
            files = {} if reserved else {f.key: getattr(stored.get(f.key), "filename", None) for f in schema.fields}
            self.fast = FastWriter.build(schema, self.columns, {k: v for k, v in files.items() if v})
        self.schema = schema

    def _in_ram(self) -> bool:
        """Whether the private folder is RAM-backed (in ``/dev/shm`` or on any tmpfs)."""
        folder = self.folder
        return folder is not None and (os.path.dirname(folder) == placement.SHM_DIR or placement.is_tmpfs(folder))

    def _allocate(self, example: TensorDict) -> TensorDictBase:
        """Let torchrl allocate its storage from ``example`` (written to slot 0); return that storage."""
        # torchrl logs an INFO line per allocation; PPO allocates twice per learn call, so keep it quiet.
        torchrl_log = logging.getLogger("torchrl")
        level = torchrl_log.level
        torchrl_log.setLevel(max(level, logging.WARNING))
        try:
            self.torchrl.set(0, example)
        finally:
            torchrl_log.setLevel(level)
        stored = self.torchrl._storage
        assert isinstance(stored, TensorDictBase)
        return stored

    def release(self) -> None:
        """Drop the rows and the schema; memory and files are freed now, not at the next GC."""
        self.columns = {}
        if self.fast is not None:
            self.fast.close()
        self.arrays = self.fast = None
        self.schema = None
        storage = self.torchrl
        stored = storage._storage
        if isinstance(stored, TensorDictBase):
            # A locked TensorDict caches key views that point back at it: a reference cycle that keeps
            # every memmap mapped until the next cyclic GC. Erasing the caches lets refcounting free them now.
            for td in [stored, *(v for v in stored.values(include_nested=True) if isinstance(v, TensorDictBase))]:
                td._erase_cache()
        del stored
        storage._storage = None
        storage.initialized = False
        storage._storage_keys = None
        storage._len = 0
        if self.folder is not None and os.path.isdir(self.folder):
            for entry in os.scandir(self.folder):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)

    def resize(self, capacity: int) -> None:
        """Release the rows and take a new capacity, reusing the torchrl storage object and its folder.

        A new torchrl storage per resize would leave the old one (and its multiprocessing counters and
        semaphores) in a reference cycle until the next cyclic GC.
        """
        self.release()
        self.capacity = capacity
        self.torchrl.max_size = capacity

    def close(self) -> None:
        """Release the rows and remove the private folder. The storage is unusable afterwards."""
        self.release()
        self.closed = True
        if self.device.type == "cpu":
            self._finalizer()

    @property
    def nbytes(self) -> int:
        """Bytes allocated for rows (0 before the first write)."""
        return 0 if self.schema is None else self.schema.row_bytes * self.capacity

    # ------------------------------------------------------------------ rows
    @torch.no_grad()  # a value that requires grad must not turn a column into a graph node
    def write(self, slot: int, pairs: list[tuple[Any, Any]]) -> None:
        """Write one row of checked ``(field, value)`` pairs at ``slot``."""
        columns = self.columns
        for field, value in pairs:
            columns[field.key][slot] = value

    @torch.no_grad()
    def write_rows(self, start: int, pairs: list[tuple[Any, Any]], first: int, n: int) -> None:
        """Write rows ``first .. first+n-1`` of each batched value to slots ``start, start+1, ...`` (mod capacity).

        Needs ``n <= capacity``. Contiguous slot ranges are slice assignments (one or two, at the wrap).
        """
        cap = self.capacity
        head = min(n, cap - start)
        columns = self.columns
        for field, value in pairs:
            column = columns[field.key]
            column[start : start + head] = value[first : first + head]
            if head < n:
                column[: n - head] = value[first + head : first + n]

    def gather(self, slots: torch.Tensor, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        """New tensors (never views) holding ``slots`` of each key (all keys by default), on the storing device.

        ``slots`` must be valid (``0 <= slot < capacity``); they are not checked again here.
        """
        arrays = self.arrays
        if arrays is not None:
            index = slots.numpy()
            wanted = arrays.keys() if keys is None else keys
            return {key: torch.from_numpy(arrays[key].take(index, axis=0)) for key in wanted}
        columns = self.columns
        if keys is None:
            return {key: column.index_select(0, slots) for key, column in columns.items()}
        return {key: columns[key].index_select(0, slots) for key in keys}

    def gather_range(self, start: int, stop: int, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        """New tensors (copies) of slots ``start .. stop-1`` of each key: a contiguous read, no index."""
        wanted = self.columns.keys() if keys is None else keys
        arrays = self.arrays
        if arrays is not None:
            return {key: torch.from_numpy(arrays[key][start:stop].copy()) for key in wanted}
        return {key: self.columns[key][start:stop].clone() for key in wanted}
