"""Where a CPU buffer's memory-mapped files go when the user names no ``storage_dir``.

RAM-backed shared memory (``/dev/shm``, torchrl's own default) when the whole buffer fits with room to
spare (in ``/dev/shm``, in the available memory, and in the memory cgroup's limit: tmpfs pages are
charged to a container like any other memory), the system temp folder (usually on disk) otherwise.

Why not always one of them:

* ``/dev/shm`` is capped at 64 MB in many containers, and a tmpfs file that outgrows its file system
  kills the process with SIGBUS on the next write, long after the buffer was built.
* The disk-backed page cache works everywhere, but every dirty page is eventually written back to
  disk: pure overhead for scratch data. On a 2-core VM the writeback of a 2.7 GB Atari buffer makes a
  single ``add`` 2-3x slower than into RAM, and loads compete with it too (``benchmarks/README.md``).

So the default checks the room first (:func:`default_parent`, for the whole buffer), and the storage
then reserves its files' pages with ``posix_fallocate`` (:func:`reserve`) as rows are written, ahead of
each write: no write can hit a full ``/dev/shm``, and if a reservation fails the storage moves to the
temp folder with the rows written so far.
Where the temp folder is a tmpfs too (some distributions mount ``/tmp`` so), it is reserved the same
way; if that fails as well the buffer stays there unreserved, with a warning that names ``storage_dir``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["CGROUP_ROOT", "SHM_DIR", "SHM_SHARE", "default_parent", "is_tmpfs", "ram_room", "reserve"]

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


#: Where the memory cgroups are mounted, and this process's cgroup paths (tests point them elsewhere).
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
_UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a number near 2**63


def _cgroup_room(folder: str, limit_file: str, usage_file: str) -> int | None:
    try:
        with open(os.path.join(folder, limit_file), encoding="ascii") as f:
            limit = f.read().strip()
        if limit == "max" or int(limit) >= _UNLIMITED:
            return None
        with open(os.path.join(folder, usage_file), encoding="ascii") as f:
            return max(int(limit) - int(f.read().strip()), 0)
    except (OSError, ValueError):
        return None


def cgroup_headroom() -> int | None:
    """Bytes this process's memory cgroup can still be charged (tmpfs pages count against it): the
    limit minus the usage (page cache included, so this errs low), the tightest of the cgroup and its
    parents, v2 or v1; ``None`` when unlimited or unknown."""
    try:
        with open(PROC_CGROUP, encoding="ascii", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, limit_file, usage_file = CGROUP_ROOT, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_file, usage_file = (
                os.path.join(CGROUP_ROOT, "memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        folder = os.path.normpath(base + "/" + path.strip("/"))
        while True:
            rooms.append(_cgroup_room(folder, limit_file, usage_file))
            if len(folder) <= len(base):
                break
            folder = os.path.dirname(folder)
    known = [room for room in rooms if room is not None]
    return min(known) if known else None


def ram_room(folder: str = SHM_DIR) -> int:
    """Bytes a new file in the RAM-backed ``folder`` could take: its free space, and no more than the
    memory the system has available (a tmpfs may be sized above the RAM) nor what this process's
    memory cgroup (a container's limit) can still be charged. 0 if ``folder`` is unusable."""
    try:
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            return 0
        st = os.statvfs(folder)
    except OSError:
        return 0
    limits = [st.f_bavail * st.f_frsize, _mem_available(), cgroup_headroom()]
    return min(limit for limit in limits if limit is not None)


def is_tmpfs(folder: str) -> bool:
    """Whether ``folder`` lies on a RAM-backed file system (tmpfs), from ``/proc/self/mounts``."""
    try:
        with open("/proc/self/mounts", encoding="ascii", errors="surrogateescape") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return False
    path = os.path.realpath(folder)
    best, fstype = -1, ""
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fstype = len(point), fields[2]
    return fstype == "tmpfs"


def default_parent(nbytes: int) -> str:
    """The folder for a buffer of ``nbytes`` stored bytes: :data:`SHM_DIR` if they fit in
    :data:`SHM_SHARE` of its :func:`ram_room` (a quarter: the rest of the program and other processes
    need RAM too), else :func:`tempfile.gettempdir` (usually on disk; see :func:`is_tmpfs`)."""
    room = ram_room(SHM_DIR)
    if room and nbytes <= SHM_SHARE * room:
        return SHM_DIR
    return tempfile.gettempdir()


def _reserve_file(item: str | tuple[str, int, int]) -> None:
    path, offset, length = (item, 0, -1) if isinstance(item, str) else item
    fd = os.open(path, os.O_RDWR)
    try:
        if length < 0:
            length = os.fstat(fd).st_size
        if length:
            os.posix_fallocate(fd, offset, length)
    finally:
        os.close(fd)


def reserve(items: Iterable[str | tuple[str, int, int]], workers: int = 2) -> None:
    """Allocate bytes of existing files now (``posix_fallocate``, ``workers`` files at a time), so that
    writes through their mappings never find the file system full. Each item is a path (the whole file)
    or ``(path, offset, length)`` (that byte range; the file keeps its size).

    Raises ``OSError`` (e.g. ``ENOSPC``); some files may then be partly allocated.
    """
    with ThreadPoolExecutor(workers, thread_name_prefix="objectrl_buffer-reserve") as pool:
        list(pool.map(_reserve_file, items))
