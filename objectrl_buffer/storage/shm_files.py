"""Files and folders that processes share outside a storage folder's owner lock, and removal of those nobody uses.

Three kinds, each named after the process that made it (``<pid>``) so that ``objectrl-buffer clean`` can
tell a dead run's leftovers from a live run's:

* ``objectrl-limiter-<pid>-XXXXXXXX``: a shared rate limiter's counters, a file in ``/dev/shm`` (the temp
  folder where there is none) that every process using the limiter maps (``torch.from_file``,
  ``MAP_SHARED``) for as long as it holds the limiter (:func:`new_file`);
* ``objectrl-shared-<pid>-XXXXXXXX``: a :class:`~objectrl_buffer.distributed.shared.SharedBuffer`'s folder
  (shared mode, ``ProcessBuffer``), in ``/dev/shm``, whose column and counter files every handle maps;
* ``objectrl-tasks-<pid>-XXXXXXXX``: the temporary folder of a ``SharedTaskStorage`` made without a path,
  in the temp folder, whose row files every process using it keeps open.

Their creator removes them when it is done, but a process killed outright (SIGKILL, the OOM killer) runs no
cleanup and leaves them behind (storage folders, :mod:`~objectrl_buffer.storage.folders`, carry an owner
lock instead: a forked child inherits it, but a ``spawn``-ed process attaching to a shared buffer would not).

Liveness: what every user of such a file or folder always has is a mapping or an open descriptor of it, which
the kernel drops when the process dies, however it dies. One is therefore *orphaned* when

* the pid in its name (its creator) is not a live process: this covers the instant between its creation
  and its first use (a reused pid keeps it a while longer, never the other way round), and
* no process uses it: no line of any readable ``/proc/<pid>/maps`` and no ``/proc/<pid>/fd/*`` names it
  or a file in it (by device and inode, or by path). A forked or spawned child still using it keeps it; the
  ``/proc`` entries of other users' processes are not readable, but these files are ``0600`` and the folders
  ``0700``: only their owner's processes, or root's, can use them.

One named without a pid (made by an older version) is judged by its users alone once it is older than
:data:`GRACE_S`. Without ``/proc`` (not Linux) nothing is ever judged orphaned.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field

from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.storage.folders import Orphan, folder_bytes

__all__ = [
    "LIMITER_PREFIX",
    "SHARED_PREFIX",
    "TASKS_PREFIX",
    "PREFIXES",
    "GRACE_S",
    "new_file",
    "new_folder",
    "find_orphans",
    "remove",
]

#: Name prefix of a shared rate limiter's counter file.
LIMITER_PREFIX = "objectrl-limiter-"
#: Name prefix of a shared buffer's folder (:class:`~objectrl_buffer.distributed.shared.SharedBuffer`).
SHARED_PREFIX = "objectrl-shared-"
#: Name prefix of a ``SharedTaskStorage``'s temporary folder.
TASKS_PREFIX = "objectrl-tasks-"
#: Every prefix :func:`find_orphans` looks for.
PREFIXES = (LIMITER_PREFIX, SHARED_PREFIX, TASKS_PREFIX)
#: How old one without a pid in its name must be before its users alone may judge it.
GRACE_S = 60.0

_NAME = re.compile("(" + "|".join(map(re.escape, PREFIXES)) + r")(?:(\d+)-)?[A-Za-z0-9_]+")


def new_file(parent: str | None = None) -> tuple[int, str]:
    """Create a counter file (``0600``) named after this process in ``parent`` (default: ``/dev/shm``,
    else the temp folder); return its open descriptor and path, as :func:`tempfile.mkstemp` does."""
    if parent is None:
        parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkstemp(prefix=f"{LIMITER_PREFIX}{os.getpid()}-", dir=parent)


def new_folder(prefix: str, parent: str | None = None) -> str:
    """Create a folder (``0700``) ``<prefix><pid>-XXXXXXXX`` named after this process in ``parent`` (default:
    the temp folder), as :func:`tempfile.mkdtemp` does; ``prefix`` is :data:`SHARED_PREFIX` or
    :data:`TASKS_PREFIX`. Raises ``OSError`` as ``mkdtemp``."""
    if prefix not in (SHARED_PREFIX, TASKS_PREFIX):
        raise InvalidArgumentError(f"prefix must be SHARED_PREFIX or TASKS_PREFIX, got {prefix!r}")
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


@dataclass
class _Users:
    """What the readable ``/proc/<pid>/maps`` and ``/proc/<pid>/fd`` of every process name: ``(device, inode)``
    of mapped files and the paths of mapped or open ones (an overlay file system shows its mapped files' own
    device and inode in ``maps``: the path is checked too)."""

    inodes: set[tuple[str, str]] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)

    @classmethod
    def scan(cls) -> _Users:
        users = cls()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            # gone meanwhile, or another user's: not readable
            with contextlib.suppress(OSError), open(f"{entry.path}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    parts = line.rstrip("\n").split(None, 5)
                    if len(parts) == 6 and parts[4] != "0":
                        users.inodes.add((parts[3], parts[4]))
                        users.paths.add(parts[5])
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"{entry.path}/fd"):
                    with contextlib.suppress(OSError):
                        users.paths.add(os.readlink(fd.path))
        return users

    def use(self, path: str, st: os.stat_result) -> bool:
        """Whether a process maps or holds open ``path`` (of ``st``), or any file under it if a folder."""
        real = os.path.realpath(path)
        if not stat.S_ISDIR(st.st_mode):
            return _inode(st) in self.inodes or path in self.paths or real in self.paths
        inside = (os.path.join(path, ""), os.path.join(real, ""))
        if path in self.paths or real in self.paths or any(p.startswith(inside) for p in self.paths):
            return True
        for root, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(OSError):  # removed meanwhile
                    if _inode(os.lstat(os.path.join(root, name))) in self.inodes:
                        return True
        return False


def _inode(st: os.stat_result) -> tuple[str, str]:
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", str(st.st_ino)


def _orphaned(path: str, users: _Users | None = None) -> Orphan | None:
    """An :class:`Orphan` for ``path`` (a file or folder of one of the kinds) if nobody uses it (see the module
    docs); ``users``: a scan of ``/proc`` taken just before (one is taken if ``None``)."""
    match = _NAME.fullmatch(os.path.basename(path))
    if match is None or not os.path.isdir("/proc"):
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    folder = match.group(1) != LIMITER_PREFIX
    if not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
        return None
    pid = int(match.group(2)) if match.group(2) else None
    if pid is not None and _alive(pid):
        return None
    if pid is None and time.time() - st.st_ctime < GRACE_S:
        return None
    if (users or _Users.scan()).use(path, st):
        return None
    return Orphan(path, pid, folder_bytes(path) if folder else st.st_blocks * 512)


def find_orphans(parent: str) -> list[Orphan]:
    """Counter files and shared-buffer and task folders in ``parent`` that no live process uses (none if
    ``parent`` cannot be read)."""
    try:
        entries = [entry.path for entry in os.scandir(parent) if entry.name.startswith(PREFIXES)]
    except OSError:
        return []
    users = _Users.scan() if entries and os.path.isdir("/proc") else None
    found = (_orphaned(path, users) for path in entries)
    return [orphan for orphan in found if orphan is not None]


def remove(orphan: Orphan) -> bool:
    """Remove ``orphan`` (a file, or a folder with everything in it) if nobody uses it still (checked again);
    whether it was removed."""
    if _orphaned(orphan.path) is None:
        return False
    try:
        if os.path.isdir(orphan.path) and not os.path.islink(orphan.path):
            shutil.rmtree(orphan.path)
        else:
            os.unlink(orphan.path)
    except OSError:  # removed meanwhile, or not ours to remove
        return False
    return True
