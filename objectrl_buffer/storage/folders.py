"""Private storage folders with an owner the kernel vouches for, and removal of the ones whose owner died.

A process killed outright (SIGKILL, the OOM killer) runs no cleanup, so its folder in ``/dev/shm`` would hold
RAM until reboot. Each folder therefore holds a lock file, :data:`LOCK_NAME`, that its owner keeps
``flock``-ed for the folder's life through one open file descriptor: the kernel drops the lock when the
last process holding that descriptor exits, however it exits. A folder whose lock can be taken has no
live owner and can go. Forked children inherit the descriptor, so a folder a child still maps is kept.

The owner writes its pid into the lock file *after* locking it, and :func:`find_orphans` skips a lock
file that is still empty: a sweeper that takes the lock between the file's creation and the owner's
``flock`` must not mistake a folder being born for a dead one. Folders without a lock file (made by an
older version, or not by us) are never touched.

:func:`sweep_once` runs at a process's first allocation in each parent folder (a ``listdir`` and a
non-blocking ``flock`` per folder of ours); ``objectrl-buffer clean`` runs :func:`find_orphans` and
:func:`remove` on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass

__all__ = ["LOCK_NAME", "PREFIX", "Orphan", "find_orphans", "folder_bytes", "make_owned", "remove", "sweep_once"]

#: Name prefix of every private storage folder.
PREFIX = "objectrl_buffer-"
#: The lock file inside each folder, held by the owning process.
LOCK_NAME = ".owner.lock"

_swept: set[str] = set()  # parents swept by this process (a forked child inherits it: its parent swept)


def make_owned(parent: str, prefix: str = PREFIX) -> tuple[str, int]:
    """Create a private folder in ``parent`` (which must exist) and lock it for this process; its name starts
    with ``prefix`` (one that starts with :data:`PREFIX`, so sweeps find it).

    Returns the folder and the descriptor holding its lock: keep it open for the folder's life and
    close it after removing the folder.
    """
    if not prefix.startswith(PREFIX):
        raise ValueError(f"make_owned: prefix {prefix!r} must start with {PREFIX!r}")
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())  # non-empty only once locked (see the module docstring)
    except OSError:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, fd


def folder_bytes(folder: str) -> int:
    """Bytes the files under ``folder`` occupy (allocated blocks: sparse files count what they hold)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


@dataclass(frozen=True)
class Orphan:
    """A folder of ours whose owner is gone: its path, the pid that made it, the bytes it holds."""

    path: str
    pid: int | None
    nbytes: int


def _owner_gone(folder: str) -> int | bool | None:
    """The recorded pid (or ``None``) if ``folder``'s lock is free and was written; ``False`` otherwise."""
    try:
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # no lock file: not ours to judge
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: a live owner
            return False
        text = os.read(fd, 64)
    finally:
        os.close(fd)
    if not text:  # being created right now (or its owner died in that instant: left alone)
        return False
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def find_orphans(parent: str) -> list[Orphan]:
    """Folders of ours in ``parent`` whose owning process is gone (none if ``parent`` cannot be read)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    orphans = []
    for entry in entries:
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid = _owner_gone(entry.path)
        if pid is not False:
            orphans.append(Orphan(entry.path, pid if isinstance(pid, int) else None, folder_bytes(entry.path)))
    return orphans


def remove(orphan: Orphan) -> bool:
    """Remove ``orphan`` if its lock is still free (checked again, under the lock); whether it was removed."""
    try:
        fd = os.open(os.path.join(orphan.path, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        shutil.rmtree(orphan.path, ignore_errors=True)
    finally:
        os.close(fd)
    return not os.path.exists(orphan.path)


def sweep_once(parent: str) -> None:
    """Remove the orphans in ``parent`` the first time this process allocates there. Never raises."""
    key = os.path.abspath(parent)
    if key in _swept:
        return
    _swept.add(key)
    for orphan in find_orphans(key):
        with contextlib.suppress(OSError):
            remove(orphan)
