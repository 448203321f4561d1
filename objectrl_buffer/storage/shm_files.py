"""Small shared files (a rate limiter's counters) that processes map, and removal of those nobody uses.

A shared rate limiter keeps its counters in one file, ``objectrl-limiter-<pid>-XXXXXXXX`` in ``/dev/shm``
(the temp folder where there is none), that every process using the limiter maps (``torch.from_file``,
``MAP_SHARED``) for as long as it holds the limiter. Its creator removes it when the limiter is
collected, but a process killed outright (SIGKILL, the OOM killer) runs no cleanup and leaves it behind.

Liveness: the file's counters are ``flock``-ed for every move already (:class:`~objectrl_buffer.core.sync.
ProcessRLock`), so no second ``flock`` can mark it in use (it would exclude its own holder's moves). What a
user of the file always has is its mapping, which the kernel drops when the process dies, however it dies.
A file is therefore *orphaned* when

* the pid in its name (its creator) is not a live process: this covers the instant between its creation
  and its first mapping (a reused pid keeps a file a while longer, never the other way round), and
* no process maps it: no line of any readable ``/proc/<pid>/maps`` names its device and inode (a forked
  or spawned child still mapping it keeps it; the maps of other users' processes are not readable, but
  the file is ``0600``: only its owner's processes, or root's, can map it).

A file named without a pid (made by an older version) is judged by its mappings alone once it is older
than :data:`GRACE_S`. Without ``/proc`` (not Linux) nothing is ever judged orphaned.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time

from objectrl_buffer.storage.folders import Orphan

__all__ = ["LIMITER_PREFIX", "GRACE_S", "new_file", "find_orphan_files", "remove_file"]

#: Name prefix of a shared rate limiter's counter file.
LIMITER_PREFIX = "objectrl-limiter-"
#: How old a counter file without a pid in its name must be before its mappings alone may judge it.
GRACE_S = 60.0

_NAME = re.compile(re.escape(LIMITER_PREFIX) + r"(?:(\d+)-)?[A-Za-z0-9_]+")


def new_file(parent: str | None = None) -> tuple[int, str]:
    """Create a counter file (``0600``) named after this process in ``parent`` (default: ``/dev/shm``,
    else the temp folder); return its open descriptor and path, as :func:`tempfile.mkstemp` does."""
    if parent is None:
        parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkstemp(prefix=f"{LIMITER_PREFIX}{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def _mapped(path: str, st: os.stat_result) -> bool:
    """Whether a readable ``/proc/<pid>/maps`` maps the file ``path`` of ``st``: by device and inode, or
    by path (an overlay file system shows its mapped files' own device and inode in ``maps``)."""
    wanted = (f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", str(st.st_ino))
    real = os.path.realpath(path)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        maps_file = os.path.join(entry.path, "maps")
        # gone meanwhile, or another user's: not readable
        with contextlib.suppress(OSError), open(maps_file, encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and ((parts[3], parts[4]) == wanted or parts[5] in (path, real)):
                    return True
    return False


def _orphaned(path: str, name: str) -> Orphan | None:
    """An :class:`Orphan` for the counter file ``path`` if nobody uses it (see the module docs)."""
    match = _NAME.fullmatch(name)
    if match is None or not os.path.isdir("/proc"):
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    pid = int(match.group(1)) if match.group(1) else None
    if pid is not None and _alive(pid):
        return None
    if pid is None and time.time() - st.st_ctime < GRACE_S:
        return None
    if _mapped(path, st):
        return None
    return Orphan(path, pid, st.st_blocks * 512)


def find_orphan_files(parent: str) -> list[Orphan]:
    """Counter files in ``parent`` that no live process uses (none if ``parent`` cannot be read)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    found = (_orphaned(entry.path, entry.name) for entry in entries if entry.name.startswith(LIMITER_PREFIX))
    return [orphan for orphan in found if orphan is not None]


def remove_file(orphan: Orphan) -> bool:
    """Remove the counter file ``orphan`` if nobody uses it still (checked again); whether it was removed."""
    if _orphaned(orphan.path, os.path.basename(orphan.path)) is None:
        return False
    try:
        os.unlink(orphan.path)
    except OSError:  # removed meanwhile, or not ours to remove
        return False
    return True
