"""Low-level file I/O for checkpoints: durable writes, exact reads, overlapped checksums, progress, cleanup.

Why threads: a save is three kinds of work that need not wait for each other: copying bytes into the
page cache (``os.write``), flushing them to the disk (``fsync``, which waits on the device), and the
crc32 checksum (CPU). ``os.write``, ``os.fsync`` and ``zlib.crc32`` on large buffers all release the
GIL, so running the fsync of one file and the checksums beside the writes of the next brings a save
close to a single raw write + fsync of the same bytes (measured in ``benchmarks/checkpoint_bench.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import secrets
import shutil
import stat
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, BinaryIO, Protocol

from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError

__all__ = [
    "fsync_path",
    "start_writeback",
    "atomic_write",
    "file_kind",
    "open_regular",
    "read_small_file",
    "write_all",
    "readinto_exact",
    "open_checkpoint_file",
    "read_verified",
    "Crc32",
    "interactive",
    "progress_bar",
    "remove_in_background",
    "wait_for_cleanup",
]


def fsync_path(path: str) -> None:
    """fsync a file or a folder by name (a folder's fsync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_sync_file_range() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):  # not Linux/glibc: start_writeback does nothing
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to the disk, without waiting (Linux ``sync_file_range``; elsewhere a
    no-op). A writer of many files that fsyncs them in a batch then overlaps the disk with its next files
    instead of finding them all dirty at the batch (the kernel itself starts only past
    ``dirty_background_ratio`` of RAM, or after 30 s): the trajectory writer's files reach the disk ~25%
    sooner on a 2-core VM (``benchmarks/README.md``)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # best effort: the fsync that follows is the guarantee


def _new_temp_file(folder: str, name: str) -> tuple[int, str]:
    """A new, empty ``<name>.<random>.tmp`` in ``folder`` opened for writing: ``(fd, path)``.

    Created with mode 0o666 so the kernel applies the umask, as for any file the user creates (the
    metadata file is shared with the group where the umask allows it; ``mkstemp`` would make it 0600).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for _ in range(100):
        path = os.path.join(folder, f"{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp file name", os.path.join(folder, name))


def atomic_write(target: str, write: Callable[[BinaryIO], None], *, durable: bool = True) -> None:
    """Write ``target`` via a temp file in its folder, fsync, ``os.replace``, fsync of the folder.

    A crash at any moment leaves either the old ``target`` or the new one, never a partial file.
    ``durable=False`` skips both fsyncs (and starts the file's writeback, :func:`start_writeback`): a killed
    process still leaves the old file or the whole new one (the page cache outlives it), and the caller makes a
    batch of such files durable at once (:func:`fsync_path` on each, then on the folder) before anything that
    names them is written: one disk flush per batch instead of two per file.
    The file gets the mode of any new file (``0o666`` less the user's umask), not ``mkstemp``'s 0600.
    ``OSError`` is wrapped in :class:`CheckpointError` naming ``target``.
    """
    folder = os.path.dirname(os.path.abspath(target))
    tmp = None
    try:
        fd, tmp = _new_temp_file(folder, os.path.basename(target))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
            else:
                start_writeback(f.fileno())
        os.replace(tmp, target)
        tmp = None
        if durable:
            fsync_path(folder)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint file '{target}': {exc.strerror or exc}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, from its ``st_mode``."""
    kinds = {
        stat.S_IFREG: "file",
        stat.S_IFDIR: "folder",
        stat.S_IFIFO: "FIFO",
        stat.S_IFSOCK: "socket",
        stat.S_IFLNK: "symbolic link",
    }
    return kinds.get(stat.S_IFMT(mode), "device")


def open_regular(path: str, *, follow_symlink: bool = False, writable: bool = False) -> int:
    """Open the checkpoint file ``path`` for reading, only if it is a regular file; return the descriptor.

    Never blocks (``O_NONBLOCK``: a FIFO put in place of a file would wait forever for a writer) and,
    unless ``follow_symlink``, never follows a symlink out of the checkpoint (``O_NOFOLLOW``). The type
    is checked on the open descriptor, so a file swapped in after a check cannot slip through.
    ``writable``: open for reading and writing, creating the file (mode ``0o666`` less the umask) if missing.

    Raises:
        FileNotFoundError: ``path`` does not exist (the caller says what is missing).
        CheckpointError: it is a symlink, a folder, a FIFO, a device or a socket.
        OSError: it cannot be opened (the caller names the checkpoint).
    """
    flags = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlink else os.O_NOFOLLOW)
    flags |= os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if not follow_symlink and os.path.islink(path):
            raise CheckpointError(f"'{path}' is a symbolic link: a checkpoint's files must be inside it") from None
        raise exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(f"'{path}' is a {file_kind(mode)}, expected a regular file")
    return fd


def read_small_file(path: str, limit: int, *, follow_symlink: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), refused if larger than ``limit``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: not a regular file, more than ``limit`` bytes, or unreadable (``OSError`` chained).
    """
    try:
        fd = open_regular(path, follow_symlink=follow_symlink)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointError(f"cannot read '{path}': {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            payload = f.read(limit + 1)  # never more: the file may be huge, or grow while read
    except OSError as exc:
        raise CheckpointError(f"cannot read '{path}': {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(payload) > limit:
        raise CheckpointError(f"'{path}' has more than the {limit} bytes such a file may have: not a checkpoint file")
    return payload


def write_all(fd: int, data: memoryview) -> None:
    """``os.write`` until every byte is written (a single write may be partial)."""
    while data:
        written = os.write(fd, data)
        data = data[written:]


def readinto_exact(f: Any, target: memoryview, source: str) -> None:
    """Fill ``target`` from the raw file ``f``; raise CheckpointError if the file ends first."""
    while target:
        n = f.readinto(target)
        if not n:
            raise CheckpointError(f"'{source}' is truncated: it ended before the size its manifest records")
        target = target[n:]


def open_checkpoint_file(path: str, what: str) -> int:
    """:func:`open_regular` for reading, its errors in checkpoint terms naming ``what`` ("trajectory file").

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CheckpointError: not a regular file, or it cannot be opened (``OSError`` chained).
    """
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{what} '{path}' is missing") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{what} {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {what} '{path}': {exc.strerror or exc}") from exc


def read_verified(path: str, what: str, *, nbytes: int | None = None, crc32: int | None = None) -> bytearray:
    """The bytes of the regular file ``path`` (see :func:`open_regular`: no symlink, FIFO or device), checked
    against the ``nbytes`` and ``crc32`` its index records where given. Allocates the file's own size, no more;
    ``what`` names the file in errors ("trajectory file", "checkpoint file").

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CheckpointError: not a regular file, another size than ``nbytes``, truncated while read, unreadable
            (``OSError`` chained), or a crc32 other than ``crc32``.
    """
    fd = open_checkpoint_file(path, what)
    try:
        size = os.fstat(fd).st_size
        if nbytes is not None and size != nbytes:
            raise CheckpointError(f"{what} '{path}' has {size} bytes, its index says {nbytes}")
        data = bytearray(size)
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            readinto_exact(f, memoryview(data), path)
    except OSError as exc:
        raise CheckpointError(f"cannot read {what} '{path}': {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if crc32 is not None and zlib.crc32(data) != crc32:
        raise CheckpointError(
            f"{what} '{path}' is damaged: its crc32 is {zlib.crc32(data):08x}, its index says {crc32:08x}"
        )
    return data


class Crc32:
    """A crc32 over chunks fed in order, computed on a worker thread so the caller can move on.

    ``add(view)`` queues a chunk and returns a future that is done once that chunk is summed (the
    caller must not change the chunk before); :meth:`value` waits for every chunk and returns the crc.
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._crc = 0
        self._last: Future[None] | None = None

    def _update(self, view: memoryview, previous: Future[None] | None) -> None:
        if previous is not None:
            previous.result()  # chunks are combined strictly in order, whatever the pool's size
        self._crc = zlib.crc32(view, self._crc)

    def add(self, view: memoryview) -> Future[None]:
        """Queue ``view`` (left unchanged until the returned future is done)."""
        self._last = self._pool.submit(self._update, view, self._last)
        return self._last

    def value(self) -> int:
        """The crc32 of every chunk added so far (waits for the queued ones)."""
        if self._last is not None:
            self._last.result()
        return self._crc


class Progress(Protocol):
    def update(self, n: int) -> object: ...


class _NoProgress:
    def update(self, n: int) -> None:
        pass


def interactive() -> bool:
    """Whether to show progress bars: stderr is a terminal and no ``CI`` variable is set."""
    stderr = sys.stderr
    return stderr is not None and stderr.isatty() and not os.environ.get("CI")


@contextmanager
def progress_bar(
    total: int, desc: str, enabled: bool | None, *, delay: float = 0.5, leave: bool = False
) -> Iterator[Progress]:
    """A tqdm bar over ``total`` bytes (``enabled=None``: only when :func:`interactive`), else a no-op.

    The bar appears only after ``delay`` seconds (by default half a second, so quick saves stay silent), and
    is erased when done unless ``leave``.
    """
    if enabled is None:
        enabled = interactive()
    try:
        from tqdm import tqdm  # optional: in the "examples" extra, not a runtime dependency
    except ImportError:
        enabled = False
    if not enabled:
        yield _NoProgress()
        return
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, delay=delay, leave=leave) as bar:
        yield bar


_cleanup_lock = threading.Lock()
_cleanups: list[threading.Thread] = []


def remove_in_background(folders: list[str]) -> None:
    """Delete ``folders`` on a (non-daemon) thread: the caller does not wait, the interpreter does at exit.

    Used for superseded checkpoint generations once the new one is durable. If the process dies first,
    the next save removes what is left.
    """
    if not folders:
        return

    def remove() -> None:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)

    thread = threading.Thread(target=remove, name="objectrl_buffer-cleanup")
    with _cleanup_lock:
        _cleanups[:] = [t for t in _cleanups if t.is_alive()]
        _cleanups.append(thread)
    thread.start()


def wait_for_cleanup(timeout: float | None = None) -> None:
    """Wait until every background removal started so far has finished."""
    with _cleanup_lock:
        threads = list(_cleanups)
    for thread in threads:
        thread.join(timeout)
