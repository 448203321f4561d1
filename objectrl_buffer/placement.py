"""Where a CPU buffer's memory-mapped files go when the user names no ``storage_dir``.

RAM-backed shared memory (``/dev/shm``, torchrl's own default) when the whole buffer fits with room to
spare, the disk-backed system temp folder otherwise.

Why not always one of them:

* ``/dev/shm`` is capped at 64 MB in many containers, and a tmpfs file that outgrows its file system
  kills the process with SIGBUS on the next write, long after the buffer was built.
* The disk-backed page cache works everywhere, but every dirty page is eventually written back to
  disk: pure overhead for scratch data. On a 2-core VM the writeback of a 2.7 GB Atari buffer makes a
  single ``add`` 2-3x slower than into RAM, and loads compete with it too (``benchmarks/README.md``).

So the default checks the room first (:func:`default_parent`), and the storage then reserves its
files' pages with ``posix_fallocate`` (:func:`reserve`): once that succeeds no later write can hit a
full ``/dev/shm``, and if it fails the storage moves to the temp folder before any row is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["SHM_DIR", "SHM_SHARE", "default_parent", "ram_room", "reserve"]

#: The RAM-backed folder tried first.
SHM_DIR = "/dev/shm"
#: Largest share of the room (see :func:`ram_room`) one buffer may take in :data:`SHM_DIR`.
SHM_SHARE = 0.25


def _mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (``None`` where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def ram_room(folder: str = SHM_DIR) -> int:
    """Bytes a new file in the RAM-backed ``folder`` could take: its free space, and no more than the
    memory the system has available (a tmpfs may be sized above the RAM). 0 if ``folder`` is unusable."""
    try:
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            return 0
        st = os.statvfs(folder)
    except OSError:
        return 0
    room = st.f_bavail * st.f_frsize
    available = _mem_available()
    return room if available is None else min(room, available)


def default_parent(nbytes: int) -> str:
    """The folder for a buffer of ``nbytes`` stored bytes: :data:`SHM_DIR` if they fit in
    :data:`SHM_SHARE` of its :func:`ram_room` (a quarter: the rest of the program and other processes
    need RAM too), else :func:`tempfile.gettempdir`."""
    room = ram_room(SHM_DIR)
    if room and nbytes <= SHM_SHARE * room:
        return SHM_DIR
    return tempfile.gettempdir()


def _reserve_file(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def reserve(paths: Iterable[str], workers: int = 2) -> None:
    """Allocate every byte of each existing file in ``paths`` now (``posix_fallocate``, ``workers`` files
    at a time), so that writes through its mappings never find the file system full.

    Raises ``OSError`` (e.g. ``ENOSPC``); some files may then be partly allocated.
    """
    with ThreadPoolExecutor(workers, thread_name_prefix="objectrl_buffer-reserve") as pool:
        list(pool.map(_reserve_file, paths))
