"""Locks the kernel releases when their holder dies (``flock``), for processes and threads alike."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["lock_file", "FileLock", "ProcessRLock", "hold_folder", "folder_held"]


@contextmanager
def lock_file(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` (created if missing) for the block, then remove it.

    ``flock`` locks belong to an open file, so two threads of one process exclude each other too, and a
    holder that dies (even by SIGKILL) releases it. The holder removes the file before releasing it, so
    a waiter that then gets the lock of a removed file opens the path again instead of going ahead.
    A lock file left by a killed holder is simply taken over.

    Raises:
        OSError: the file cannot be created or opened (read-only folder, a symlink or a non-file there).
    """
    while True:
        # O_NONBLOCK: a FIFO at the path must not block the open; O_NOFOLLOW: never lock (or create) elsewhere.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        try:
            held = os.fstat(fd)
            if not stat.S_ISREG(held.st_mode):
                raise OSError(errno.EINVAL, "exists and is not a regular file", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                now = os.stat(path, follow_symlinks=False)
                current = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)  # the previous holder removed this file: lock the one at the path now
    try:
        yield
    finally:
        with suppress(OSError):  # best effort: a lock file left behind is taken over by the next holder
            os.unlink(path)
        os.close(fd)


def hold_folder(path: str) -> int:
    """Open the folder ``path`` and hold a shared ``flock`` on it, which marks it in use (see
    :func:`folder_held`) until the returned descriptor is closed or its process dies (the kernel releases
    it, even on SIGKILL). Several holders may share a folder. Nothing is written into the folder.

    Raises:
        OSError: ``path`` is not a folder (a symlink is not followed) or cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def folder_held(path: str) -> bool:
    """Whether some live descriptor of :func:`hold_folder` holds the folder ``path`` now (an exclusive
    ``flock`` tried without waiting, and released at once). ``False`` if ``path`` is no folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock taken, if it was
    return False


class FileLock:
    """An exclusive ``flock`` on an existing file kept open: the per-call cost of :func:`lock_file` (open,
    stat, unlink, close: ~10 us on ``/dev/shm``) drops to two syscalls (~1 us), for a lock taken per add.

    The kernel releases it when its holder dies (even by SIGKILL). Threads of one process exclude each
    other through a :class:`threading.Lock` (``flock`` does not: they share the open file). A forked child
    reopens the file at its first use (an inherited descriptor would share the parent's lock).
    The file is never removed (it is the data file the lock guards, or a file beside it).

    Raises:
        OSError: the file cannot be opened (at the first :meth:`acquire` of each process).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.thread_lock = threading.Lock()
        _LOCKS.add(self)

    def acquire(self) -> None:
        """Block until this process holds the lock."""
        self.thread_lock.acquire()
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.thread_lock.release()
            raise

    def release(self) -> None:
        """Release the lock (the caller holds it)."""
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.thread_lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def forget(self) -> None:
        """After a fork, in the child: the inherited descriptor is the parent's; open a new one when needed."""
        if self.fd >= 0:
            with suppress(OSError):  # the parent's lock lives on: its own descriptor still refers to it
                os.close(self.fd)
        self.fd = -1
        self.thread_lock = threading.Lock()

    def __getstate__(self) -> dict[str, str]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


_LOCKS: weakref.WeakSet[FileLock] = weakref.WeakSet()


def _forget_locks() -> None:
    for lock in list(_LOCKS):
        lock.forget()


os.register_at_fork(after_in_child=_forget_locks)


class ProcessRLock:
    """A re-entrant lock that also excludes other processes: a thread's outermost hold takes a
    :class:`FileLock` on ``path`` (the kernel frees it if the process dies). Usable by
    :class:`threading.Condition`, whose ``wait`` releases it fully (other processes do not ``notify``:
    waiters poll with a timeout).

    ``path=None``: a plain thread lock until :meth:`use_file` (the same object, so a ``Condition`` built on
    it and the threads waiting there carry on). In a fork child, a hold by a thread that the fork left
    behind is dropped (only the forking thread lives on there; its own hold is kept).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.rlock = threading.RLock()
        self.file: FileLock | None = None if path is None else FileLock(path)
        self.depth = 0
        self.owner = 0
        _PROCESS_LOCKS.add(self)

    def use_file(self, path: str) -> None:
        """From now on also exclude other processes through a :class:`FileLock` on ``path``; the calling
        thread must hold this lock (its hold then takes the file lock too), or nobody may."""
        if self.file is not None:
            raise RuntimeError(f"ProcessRLock already uses {self.path!r}")
        file = FileLock(path)
        if self.depth:
            if self.owner != threading.get_ident():
                raise RuntimeError("use_file() while another thread holds the lock")
            file.acquire()
        self.path, self.file = path, file

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.rlock.acquire()
        if self.depth == 0:
            if self.file is not None:
                try:
                    self.file.acquire()
                except BaseException:
                    self.rlock.release()
                    raise
            self.owner = threading.get_ident()
        self.depth += 1
        return True

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = 0
            if self.file is not None:
                self.file.release()
        self.rlock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    # what threading.Condition uses when the lock has it (a full release around wait)
    def _release_save(self) -> int:
        depth, self.depth, self.owner = self.depth, 0, 0
        if self.file is not None:
            self.file.release()
        for _ in range(depth):
            self.rlock.release()
        return depth

    def _acquire_restore(self, depth: int) -> None:
        for _ in range(depth):
            self.rlock.acquire()
        if self.file is not None:
            self.file.acquire()
        self.depth, self.owner = depth, threading.get_ident()

    def _is_owned(self) -> bool:
        return self.depth > 0 and self.owner == threading.get_ident()

    def forget_other_threads(self) -> None:
        """In a fork child: drop a hold of a thread the fork left behind (it can never release it)."""
        if self.owner != threading.get_ident():  # not held, held by a lost thread, or being taken by one
            self.rlock = threading.RLock()
            self.depth = self.owner = 0


_PROCESS_LOCKS: weakref.WeakSet[ProcessRLock] = weakref.WeakSet()


def _forget_other_threads() -> None:
    for lock in list(_PROCESS_LOCKS):
        lock.forget_other_threads()


os.register_at_fork(after_in_child=_forget_other_threads)
