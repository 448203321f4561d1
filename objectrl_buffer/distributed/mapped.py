"""Which same-node writer files a shard maps, and how: only a writer's own folder, read-only.

A shared-rows descriptor (:class:`~objectrl_buffer.distributed.wire.SharedRows`) comes through Ray, and Ray
clusters have no authentication by default: whoever reaches the cluster can send one naming any path. So a
shard maps a descriptor's files only when

* the folder's path has no symbolic link anywhere (``os.path.realpath`` of it is itself) and its parent is one
  of the folders writers make theirs in (:func:`allowed_parents`: ``/dev/shm`` and the temp folder,
  ``tempfile.gettempdir()``, i.e. ``TMPDIR``), and its name starts with the writer's prefix for this buffer;
* the folder belongs to this process's user and is not group- or world-writable (a writer's folder is
  ``mkdtemp``'s, mode 0700): nobody else can have put files in it;
* each column file is opened without following a link (``O_NOFOLLOW``), is a regular file of this user's,
  and holds the rows the descriptor says;

and maps each file read-only (``mmap`` with ``ACCESS_READ``, from the descriptor it checked): the shard never
writes to a writer's files, and the arrays it gets are not writable.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import tempfile

import numpy as np

from objectrl_buffer.errors import BufferUnavailable, InvalidArgumentError
from objectrl_buffer.storage.placement import SHM_DIR

__all__ = ["allowed_parents", "check_folder", "map_column"]


def allowed_parents() -> set[str]:
    """The folders a writer's folder may be in: ``/dev/shm`` and ``tempfile.gettempdir()`` (real paths)."""
    return {os.path.realpath(SHM_DIR), os.path.realpath(tempfile.gettempdir())}


def check_folder(folder: str, prefix: str, who: str) -> None:
    """Refuse ``folder`` unless it is a writer's own (see the module docs); ``who`` starts the message.

    Raises:
        InvalidArgumentError: it is not (the message names the folder and the reason).
        BufferUnavailable: it is not there (its writer closed, or it is on another node).
    """

    def refuse(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{who}: a shared-rows batch names folder {folder!r}, not one of writer's own folders of this buffer "
            f"({prefix}* in {sorted(allowed_parents())}): {why}; refused"
        )

    if not os.path.isabs(folder) or os.path.normpath(folder) != folder:
        raise refuse("not a plain absolute path")
    if not os.path.basename(folder).startswith(prefix):
        raise refuse("not the writer's name")
    if os.path.dirname(folder) not in allowed_parents():
        raise refuse("not in a folder writers use")
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise BufferUnavailable(f"{who}: the rows of the writer's batch are not here ({exc})") from None
    if os.path.realpath(folder) != folder or not stat.S_ISDIR(info.st_mode):
        raise refuse("a symbolic link")
    if info.st_uid != os.getuid():
        raise refuse(f"owned by uid {info.st_uid}, not this process's {os.getuid()}")
    if info.st_mode & 0o022:
        raise refuse(f"group- or world-writable (mode {stat.S_IMODE(info.st_mode):o})")


def map_column(path: str, dtype: np.dtype, shape: tuple[int, ...], who: str) -> np.ndarray:
    """The file ``path`` as a read-only array of ``dtype`` and ``shape`` (its first bytes), mapped from a
    descriptor opened without following links.

    Raises:
        InvalidArgumentError: a link, not a regular file, or another user's (named).
        BufferUnavailable: the file is not there or holds fewer bytes than ``shape`` needs.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise InvalidArgumentError(f"{who}: shared-rows file {path!r} is a symbolic link; refused") from None
        raise BufferUnavailable(f"{who}: the rows of the writer's batch are not here ({exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise InvalidArgumentError(f"{who}: shared-rows file {path!r} is not a regular file of this user; refused")
        size = math.prod(shape) * dtype.itemsize
        if info.st_size < size:
            raise BufferUnavailable(f"{who}: shared-rows file {path!r} holds {info.st_size} bytes, not {size}")
        if size == 0:
            return np.empty(shape, dtype)
        view = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return np.frombuffer(view, dtype, math.prod(shape)).reshape(shape)
