"""Where rows live: a torchrl storage on the storing device, and cheap per-key access to it.

* CPU: torchrl ``LazyMemmapStorage`` with its files in a private folder, made in ``storage_dir`` when
  the user names one. Otherwise :mod:`~objectrl_buffer.storage.placement` picks the parent when the row size
  is known (first write): ``/dev/shm`` if the whole buffer fits there with room to spare, the
  disk-backed temp folder if not, so a 64 MB ``/dev/shm`` never stops it. Each private folder holds a
  lock its process keeps (:mod:`~objectrl_buffer.storage.folders`), so folders of killed processes are found
  and removed at the next first allocation.
* Any other device (CUDA, MPS, ...): torchrl ``LazyTensorStorage`` on that device. So is a CPU storage built
  ``in_memory=True`` (a trajectory buffer's bounded window, rewritten in place: no file to place or sweep).

torchrl allocates the storage on the first write and owns its layout. After that we keep a plain
``torch.Tensor`` view of each key ("columns") and write rows into them with slice assignment, and
read rows with ``index_select``. Why not torchrl's own ``set``/``get``: those go through TensorDict
indexing and cost ~200 us per single-row write and ~300 us per 256-row read on a 2-core CPU, where a
column write or gather costs ~2-10 us per key (see ``benchmarks/``).

On the CPU the same memory is also viewed as NumPy arrays (``arrays``): ``ndarray.take`` gathers 256
rows ~1.5x faster than ``index_select``, a contiguous slice copies ~2x faster than ``Tensor.clone``,
and :class:`~objectrl_buffer.storage.fast_write.FastWriter` writes single rows through them.

RAM-backed files (the default placement) are reserved lazily, in proportion to the rows written: slots
``0 .. reserved-1`` are reserved (``posix_fallocate``) and mapped (``MADV_POPULATE_WRITE``), and a write
past ``reserved`` (one int comparison on every write path) first grows that prefix geometrically
(:meth:`TransitionStorage._grow`), so no row is ever written to a page that was not reserved: a full
``/dev/shm`` cannot kill the process with SIGBUS. If growing fails (another process filled
``/dev/shm``), the storage moves to the temp folder with the rows written so far, and warns.
A storage built with ``write_fresh=True`` (the trajectory room's chunks) instead writes a block that
reaches past ``reserved`` with ``os.pwrite`` (:meth:`TransitionStorage._write_fresh`): the pages it
allocates are as reserved as ``posix_fallocate``'s, a full ``/dev/shm`` answers ``ENOSPC`` instead of
SIGBUS (then it falls back to growing, or moving, as above), and no write fault is taken. Those pages are
not mapped: a later write into them (a ring's next pass) maps them first with one ``MADV_POPULATE_WRITE``
per column (:attr:`TransitionStorage.mapped`), since a store through the mapping into a page that
``pwrite`` allocated takes a write fault per 4 KiB (~4x the populate on a 2-core VM).

:meth:`TransitionStorage.release` (``reset()``) keeps the CPU files, mappings and reservation for the
next write of the same schema, so a reset and the first write after it cost in proportion to the rows
written, not the capacity. Another schema, :meth:`resize` or :meth:`close` frees them deterministically
(drops the only reference to the memmaps and unlinks their files), so a buffer that is reset 10,000
times holds a constant number of open files and bytes: the same torchrl storage object is reused.

torchrl's storage and writer are built ``compilable``: their counters are plain ints instead of
``multiprocessing.Value`` objects, whose POSIX semaphores live in ``/dev/shm`` (``sem.mp-*``): a buffer on
disk must not need ``/dev/shm``, and a killed process must not leave semaphores there.
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

from objectrl_buffer.core.ring import spans
from objectrl_buffer.core.schema import Key, Schema
from objectrl_buffer.errors import ClosedBufferError, InvalidArgumentError
from objectrl_buffer.storage import folders, placement, torchrl_compat
from objectrl_buffer.storage.fast_write import FastWriter, numpy_views
from objectrl_buffer.storage.prefault import populate_all, populate_write

__all__ = ["RESERVE_STEP_BYTES", "TransitionStorage", "make_tensordict"]

#: Smallest step (bytes of whole rows, all columns together) by which RAM-backed storage reserves rows.
RESERVE_STEP_BYTES = 1 << 20


def _remove_folders(owned: dict[str, int], owner_pid: int) -> None:
    """Remove every folder in ``owned`` and release its lock (at close, or at exit for a storage never closed).

    Only in the process that made them: a ``fork`` child that exits normally runs this finalizer too, and
    must leave its parent's rows alone (it only closes its inherited descriptors; the parent's lock holds).
    """
    mine = os.getpid() == owner_pid
    for folder, lock in owned.items():
        if mine:
            shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)
    owned.clear()


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` at ``offset`` of ``fd`` (``pwrite`` may write less than asked)."""
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def make_tensordict(
    values: dict[Key, torch.Tensor], batch_size: torch.Size, device: torch.device | None, nested: bool = True
) -> TensorDict:
    """A TensorDict of freshly gathered tensors (all already on ``device``), without re-checking them.

    Nested keys become nested dicts (``nested=False`` says there are none: the per-step read then skips
    the walk). The per-key checks of the public constructor are skipped
    (:func:`~objectrl_buffer.storage.torchrl_compat.new_tensordict`): the tensors were just produced with
    the right shapes and device.
    """
    if not nested:
        return torchrl_compat.new_tensordict(values, batch_size, device, nested=False)  # type: ignore[arg-type]
    source: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(key, str):
            source[key] = value
            continue
        node = source
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return torchrl_compat.new_tensordict(source, batch_size, device)


class TransitionStorage:
    """Fixed-capacity rows of one schema on one device.

    Args:
        capacity: number of rows (slots), > 0.
        device: the storing device. CPU gives memory-mapped files, anything else device tensors.
        directory: parent folder for the CPU memmap files, where a private sub-folder is created at
            once. ``None``: :mod:`~objectrl_buffer.storage.placement` chooses the parent at the first
            :meth:`initialize`. The sub-folder is removed by :meth:`close` (or at exit).
        write_fresh: :meth:`write_rows` writes rows past the reserved ones of RAM-backed storage with
            ``os.pwrite`` (:meth:`_write_fresh`): for writers of large sequential blocks (trajectories).
        in_memory: on the CPU, plain process memory (torchrl ``LazyTensorStorage``) instead of files, for a
            bounded store that rewrites its rows (a trajectory buffer's window): no file, no placement, and
            :meth:`write_rows` maps the rows it is about to write first, so a first write takes no fault per
            page. Private memory costs less to allocate and map than a RAM-backed file's (page cache) pages.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        directory: str | os.PathLike[str] | None = None,
        *,
        write_fresh: bool = False,
        in_memory: bool = False,
    ) -> None:
        self.capacity = capacity
        self.write_fresh = write_fresh
        if in_memory and directory is not None:
            raise InvalidArgumentError("an in_memory storage has no files: pass no directory")
        self.in_memory = in_memory = in_memory and device.type == "cpu"
        self.device = device
        self.schema: Schema | None = None
        self.columns: dict[Key, torch.Tensor] = {}
        self.arrays: dict[Key, np.ndarray] | None = None  # NumPy views of the CPU columns
        self.fast: FastWriter | None = None  # per-schema fast path of add/add_batch (CPU only)
        self.folder: str | None = None
        self._parent = os.fspath(directory) if directory is not None else None  # None: placement decides
        self._folders: dict[str, int] = {}  # private folder -> its lock's fd; removed by close() or at exit
        self.reserved = 0  # slots 0 .. reserved-1 may be written; a write past them calls _grow first
        self.mapped = 0  # write_fresh RAM-backed storage: slots 0 .. mapped-1 are mapped (see write_rows)
        self._lazy = False  # whether rows are reserved as written (RAM-backed default placement)
        self._files: list[tuple[str, int]] = []  # (column file, bytes per row) of the lazily reserved files
        self._paths: dict[Key, str] = {}  # the lazily reserved files by key, for _write_fresh
        self._fds: dict[Key, int] = {}  # those opened by _write_fresh so far; closed by _free
        # what release() kept for the next initialize of the same schema: schema, columns, arrays, fast
        self._spare: tuple[Schema, dict[Key, torch.Tensor], dict[Key, np.ndarray] | None, FastWriter | None] | None
        self._spare = None
        self.closed = False
        self.torchrl: TensorStorage
        if device.type == "cpu" and not in_memory:
            self.torchrl = LazyMemmapStorage(capacity, existsok=True, auto_cleanup=False, compilable=True)
            self._finalizer = weakref.finalize(self, _remove_folders, self._folders, os.getpid())
            if self._parent is not None:
                try:
                    self._make_folder(self._parent)
                except OSError as exc:  # read-only, no permission, out of inodes, a file in the way
                    raise InvalidArgumentError(
                        f"storage_dir '{self._parent}': cannot make the buffer's folder there: {exc}"
                    ) from exc
        else:
            self.torchrl = LazyTensorStorage(capacity, device=device, compilable=True)

    def _make_folder(self, parent: str) -> None:
        """Create this storage's private folder in ``parent`` and point torchrl at it."""
        os.makedirs(parent, exist_ok=True)
        folders.sweep_once(parent)
        folder, lock = folders.make_owned(parent)
        self.folder = folder
        self._folders[folder] = lock
        assert isinstance(self.torchrl, LazyMemmapStorage)
        self.torchrl.scratch_dir = self.folder + os.sep

    def _place(self, nbytes: int) -> None:
        """Without a user ``storage_dir``: move the (empty) private folder to where ``nbytes`` belong."""
        if self._parent is not None:
            return
        folders.sweep_once(placement.SHM_DIR)  # before measuring its room: dead runs' folders hold RAM
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
            lock = self._folders.pop(self.folder, None)
            if lock is not None:
                os.close(lock)
            self.folder = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def initialized(self) -> bool:
        """Whether a schema has been fixed and memory allocated."""
        return self.schema is not None

    def initialize(self, schema: Schema, first_row: dict[Key, torch.Tensor], *, populate: bool = True) -> None:
        """Allocate ``capacity`` rows of ``schema`` through torchrl, from one example row (nothing is written).

        Reuses what :meth:`release` kept when ``schema`` is the same (files, mappings, reserved rows).
        Placed in RAM by default (``/dev/shm``, or a temp folder that is a tmpfs; see
        :mod:`~objectrl_buffer.storage.placement`), no row is reserved yet: writes reserve and map rows as they
        reach them (:meth:`_grow`). ``populate`` is kept for callers of older versions and unused: a
        loader that fills rows itself calls :meth:`reserve_rows` with ``populate=False``.

        Raises:
            ClosedBufferError: after :meth:`close`.
            OSError: the memmap files cannot be created.
        """
        if self.closed:
            raise ClosedBufferError("this buffer was closed: its storage is freed and cannot take rows again")
        spare = self._spare
        if spare is not None:
            if spare[0] == schema:
                self._spare = None
                self.schema, self.columns, self.arrays, self.fast = spare
                return
            del spare
            self._free()
        example = make_tensordict(first_row, torch.Size([]), None).to(self.device)
        if self.device.type == "cpu" and not self.in_memory:
            self._place(schema.row_bytes * self.capacity)
        self._adopt(self._allocate(example), schema)

    def _adopt(self, stored: TensorDictBase, schema: Schema) -> None:
        """Take the columns of torchrl's freshly allocated ``stored`` as this storage's rows of ``schema``."""
        # Plain-tensor views: indexing the MemoryMappedTensor subclass costs an extra dispatch per call.
        self.columns = {f.key: stored.get(f.key).as_subclass(torch.Tensor) for f in schema.fields}
        self.schema = schema
        self.reserved = self.capacity
        self.mapped = 0
        if self.device.type != "cpu":
            return
        if self.in_memory:
            self.arrays = numpy_views(self.columns)
            self.fast = FastWriter.build(schema, self.columns, {})
            return
        names = {f.key: getattr(stored.get(f.key), "filename", None) for f in schema.fields}
        files = {k: v for k, v in names.items() if v and os.path.exists(v)}  # none for an empty column
        self._lazy = self._parent is None and self.folder is not None and self._in_ram()
        self._files = [(files[f.key], f.row_bytes) for f in schema.fields if f.key in files]
        self._paths = files if self._lazy else {}
        self.arrays = numpy_views(self.columns)
        # Disk-backed files take wide rows through pwrite (see fastpath.WIDE_ROW_BYTES); reserved RAM
        # is never written back, so its mapped pages stay writable and plain stores are cheaper.
        self.fast = FastWriter.build(schema, self.columns, {} if self._lazy else files)
        self.mapped = 0
        if self._lazy:
            self._set_reserved(0)

    def _set_reserved(self, rows: int) -> None:
        self.reserved = rows
        if self.fast is not None:
            self.fast.limit = rows

    def reserve_rows(self, rows: int, populate: bool = True) -> None:
        """Make slots ``0 .. rows-1`` writable before something other than :meth:`write`/:meth:`write_rows`
        fills them (a checkpoint load); ``populate=False`` leaves mapping the pages to that writer.
        :attr:`columns` may be new tensors afterwards (see :meth:`_grow`)."""
        if rows > self.reserved:
            self._grow(rows, populate)

    def _grow(self, needed: int, populate: bool = True) -> None:
        """Reserve (and with ``populate`` map) slots up to at least ``needed``: twice the reserved rows, or
        :data:`RESERVE_STEP_BYTES` of rows at first, at most the capacity. Growth is geometric, so a buffer
        filled row by row grows ~log2(capacity) times, and each growth costs in proportion to its rows.

        If the file system cannot reserve them (another process filled ``/dev/shm``), the storage moves to
        the temp folder with every reserved row (:meth:`_move`) and nothing is lost.
        """
        old = self.reserved
        schema = self.schema
        assert schema is not None
        step = max(1, RESERVE_STEP_BYTES // max(schema.row_bytes, 1))
        rows = min(self.capacity, max(needed, 2 * old, step))
        try:
            placement.reserve((path, old * size, (rows - old) * size) for path, size in self._files)
        except OSError:
            self._move(rows)
            return
        if populate:
            flats = [c.reshape(-1).view(torch.uint8) for c in self.columns.values() if c.is_contiguous()]
            cap = self.capacity
            populate_all([flat[flat.numel() * old // cap : flat.numel() * rows // cap] for flat in flats])
            if self.mapped >= old:
                self.mapped = rows
        self._set_reserved(rows)

    def _move(self, needed: int) -> None:
        """Growing the reservation failed: move to the temp folder (disk, usually) with the rows written so far.

        Every written row lies in slots ``0 .. reserved-1``; those are copied. Where the temp folder is a
        tmpfs that cannot reserve either, the storage stays where it is, unreserved, with a warning.
        """
        schema, old_folder, rows = self.schema, self.folder, self.reserved
        assert schema is not None and old_folder is not None
        temp = tempfile.gettempdir()
        if os.path.dirname(old_folder) == temp:
            self._lazy = False
            self._set_reserved(self.capacity)
            warnings.warn(
                f"the replay buffer's {schema.row_bytes * self.capacity / 2**30:.2f} GiB could not be "
                f"reserved in '{old_folder}', a RAM-backed folder: writes may kill the process (SIGBUS) "
                "if it fills up. Pass storage_dir= a folder on disk.",
                RuntimeWarning,
                stacklevel=5,
            )
            return
        kept = self.columns  # these views keep the old mappings (and rows) alive after the files are unlinked
        self._free()
        self._remove_folder()
        self._make_folder(temp)
        zeros = {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields}
        example = make_tensordict(zeros, torch.Size([]), None)
        self._adopt(self._allocate(example), schema)
        if self._lazy:  # a tmpfs temp folder: reserved the same way
            self._grow(max(needed, rows))
        if rows:
            with torch.no_grad():
                for key, column in self.columns.items():
                    column[:rows] = kept[key][:rows]
            warnings.warn(
                f"'{os.path.dirname(old_folder)}' is full: the replay buffer moved its {rows} rows to "
                f"'{self.folder}' to keep growing. Pass storage_dir= a folder on disk to choose where it lives.",
                RuntimeWarning,
                stacklevel=5,
            )
        del kept

    def _in_ram(self) -> bool:
        """Whether the private folder is RAM-backed (in ``/dev/shm`` or on any tmpfs)."""
        folder = self.folder
        return folder is not None and (os.path.dirname(folder) == placement.SHM_DIR or placement.is_tmpfs(folder))

    def _allocate(self, example: TensorDict) -> TensorDictBase:
        """Let torchrl allocate its storage shaped like ``example`` (nothing written); return that storage."""
        # torchrl logs an INFO line per allocation; PPO allocates twice per learn call, so keep it quiet.
        torchrl_log = logging.getLogger("torchrl")
        level = torchrl_log.level
        torchrl_log.setLevel(max(level, logging.WARNING))
        try:
            # _init, not set(0, example): no row may be written before its pages are reserved
            torchrl_compat.allocate(self.torchrl, example)
        finally:
            torchrl_log.setLevel(level)
        stored = torchrl_compat.stored_tensordict(self.torchrl)
        assert stored is not None
        return stored

    def release(self) -> None:
        """Drop the rows and the schema (``reset()``).

        CPU storage keeps its files, mappings and reserved rows for the next :meth:`initialize` with the
        same schema (a reset then costs nothing, and neither does that write); another schema,
        :meth:`resize` and :meth:`close` free them. Other devices free their memory now.
        """
        if self.device.type == "cpu" and self.schema is not None:
            self._spare = (self.schema, self.columns, self.arrays, self.fast)
            self.columns, self.arrays, self.fast, self.schema = {}, None, None, None
            return
        if self._spare is None:
            self._free()

    def _free(self) -> None:
        """Drop the rows, the schema and what :meth:`release` kept: memory and files are freed now, not at a GC."""
        spare, self._spare = self._spare, None
        if spare is not None:
            self.columns, self.arrays, self.fast = spare[1], spare[2], spare[3]
        del spare
        self.columns = {}
        if self.fast is not None:
            self.fast.close()
        self.arrays = self.fast = None
        self.schema = None
        self.reserved = self.mapped = 0
        self._lazy = False
        self._files = []
        self._paths = {}
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        torchrl_compat.drop_stored(self.torchrl)  # freed now: no reference cycle left for a later GC
        if self.folder is not None and os.path.isdir(self.folder):
            for entry in os.scandir(self.folder):
                if entry.name == folders.LOCK_NAME:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)

    def resize(self, capacity: int) -> None:
        """Free the rows and take a new capacity, reusing the torchrl storage object and its folder.

        A new torchrl storage per resize would leave the old one in a reference cycle until the next cyclic GC.
        """
        self._free()
        self.capacity = capacity
        self.torchrl.max_size = capacity

    def close(self) -> None:
        """Free the rows and remove the private folder. The storage is unusable afterwards."""
        self._free()
        self.closed = True
        if self.device.type == "cpu" and not self.in_memory:
            self._finalizer()

    @property
    def nbytes(self) -> int:
        """Bytes allocated for rows (0 before the first write)."""
        return 0 if self.schema is None else self.schema.row_bytes * self.capacity

    # ------------------------------------------------------------------ rows
    @torch.no_grad()  # a value that requires grad must not turn a column into a graph node
    def write(self, slot: int, pairs: list[tuple[Any, Any]]) -> None:
        """Write one row of checked ``(field, value)`` pairs at ``slot``."""
        if slot >= self.reserved:
            self._grow(slot + 1)
        columns = self.columns
        for field, value in pairs:
            columns[field.key][slot] = value

    @torch.no_grad()
    def write_rows(self, start: int, pairs: list[tuple[Any, Any]], first: int, n: int) -> None:
        """Write rows ``first .. first+n-1`` of each batched value to slots ``start, start+1, ...`` (mod capacity).

        Needs ``n <= capacity``. Contiguous slot ranges are slice assignments (one or two, at the wrap).
        """
        parts = spans(start, n, self.capacity)  # one range, or two at the wrap
        if parts[0][1] > self.reserved:
            lo, hi = parts[0]
            if len(parts) == 1 and lo <= self.reserved and self._write_fresh(lo, hi, pairs, first):
                return
            self._grow(parts[0][1])
        if self.write_fresh and (self._lazy or self.in_memory):
            for lo, hi in parts:
                self._map_before_store(lo, hi)
        columns, arrays = self.columns, self.arrays
        for field, value in pairs:
            column = columns[field.key]
            array = arrays[field.key] if arrays is not None else None
            row = first
            for lo, hi in parts:
                source = value[row : row + hi - lo]
                if (
                    array is not None
                    and isinstance(source, torch.Tensor)
                    and source.device.type == "cpu"
                    and not (source.is_conj() or source.is_neg())  # lazy views NumPy cannot see: torch resolves them
                ):
                    # glibc's memcpy (non-temporal stores for a large block): ~12% faster than Tensor.copy_
                    # into rows not in the cache (12.6 MB: 1.85 against 2.10 ms on a 2-core VM)
                    np.copyto(array[lo:hi], source.detach().numpy(), casting="no")
                else:
                    column[lo:hi] = source
                row += hi - lo

    def _map_before_store(self, lo: int, hi: int) -> None:
        """Map slots ``lo .. hi-1`` where they lie past :attr:`mapped` (rows :meth:`_write_fresh` wrote, so
        allocated but not mapped) before stores write them: one ``MADV_POPULATE_WRITE`` per column instead
        of a write fault per page. Only the rows about to be written: no stall when a ring wraps."""
        mapped = self.mapped
        if hi <= mapped:
            return
        start = max(lo, mapped)
        for column in self.columns.values():
            if column.is_contiguous() and column.numel():
                populate_write(column[start:hi].reshape(-1).view(torch.uint8))
        if lo <= mapped:
            self.mapped = hi

    def _write_fresh(self, lo: int, hi: int, pairs: list[tuple[Any, Any]], first: int) -> bool:
        """Write rows ``first ..`` of each batched value to slots ``lo .. hi-1``, which reach past
        :attr:`reserved` (``lo <= reserved``), with ``os.pwrite`` into the RAM-backed column files; on
        success those slots are reserved. Returns ``False`` (having written nothing a reader can see:
        the slots hold no stored row yet) where it does not apply or the file system is full; the caller
        then reserves (:meth:`_grow`, which may move the storage) and writes through the mapping.

        Why: a fresh tmpfs page written through the mapping costs a reservation, a write fault and
        the copy (~1.1 ms/MB on a 2-core VM); ``pwrite`` allocates the page while copying into it,
        with no fault (~0.7 ms/MB), and a page it allocated is as reserved as one ``posix_fallocate``
        allocated. Readers see the bytes through the mapping at once (one page cache per file).
        """
        if not (self._lazy and self.write_fresh):
            return False
        blocks: list[tuple[int, int, np.ndarray]] = []
        for field, value in pairs:
            path = self._paths.get(field.key)
            if path is None:  # a column with no bytes (no file): nothing to write or reserve
                continue
            if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
                return False
            block = value[first : first + hi - lo].detach().contiguous()
            fd = self._fds.get(field.key)
            if fd is None:
                fd = self._fds[field.key] = os.open(path, os.O_RDWR)
            data = block.reshape(-1).view(torch.uint8).numpy()
            if data.nbytes != (hi - lo) * field.row_bytes:  # not exactly these rows: the general path decides
                return False
            blocks.append((fd, lo * field.row_bytes, data))
        try:
            for fd, offset, data in blocks:
                _pwrite_all(fd, memoryview(data.data), offset)
        except OSError:  # e.g. ENOSPC: a full /dev/shm; no SIGBUS, unlike a store through the mapping
            return False
        self._set_reserved(hi)
        return True

    def gather(self, slots: torch.Tensor, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        """New tensors (never views) holding ``slots`` of each key (all keys by default), on the storing device.

        ``slots`` must be valid (``0 <= slot < capacity``); they are not checked again here.
        """
        arrays = self.arrays
        if arrays is not None:
            index = slots.numpy()
            if keys is None:
                return {key: torch.from_numpy(array.take(index, axis=0)) for key, array in arrays.items()}
            return {key: torch.from_numpy(arrays[key].take(index, axis=0)) for key in keys}
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
