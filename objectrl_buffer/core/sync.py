"""Locks the kernel releases when their holder dies (``flock``), for processes and threads alike."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["lock_file"]


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
