"""AWorld's ``MultiProcMemoryStorage`` under its name and module path, as a thin constructor over
:class:`SharedTaskStorage` (rows in files under a kernel-released lock, instead of a Manager's pickles).

The storage's folder is recorded in the ``data_dict`` it is given, under :data:`FOLDER_KEY`: every storage
built on the same ``data_dict`` (a ``multiprocessing.Manager().dict()`` handed to other processes, each
building its own storage from it, as AWorld's processes may) attaches to the same folder, so they all see the
same rows, as AWorld's did through its Manager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import weakref
from typing import Any

from objectrl_buffer.core.validate import _brief, folder
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.storage import shm_files

from .shared import SharedTaskStorage

__all__ = ["MultiProcMemoryStorage", "FOLDER_KEY"]

FOLDER_KEY = "objectrl_buffer.tasks:folder"
"""The ``data_dict`` key that holds the shared folder's path (no AWorld task_id can collide: AWorld's
``data_dict`` maps task_ids to shared-memory names, and ours holds nothing else)."""


_TEMPORARY_KEY = "objectrl_buffer.tasks:temporary"  # the recorded folder, when a storage made it temporary


def _remove_folder(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked copy of the Manager dropping its reference must not delete the folder
        shutil.rmtree(path, ignore_errors=True)


class MultiProcMemoryStorage(SharedTaskStorage):
    """``MultiProcMemoryStorage(data_dict, fifo_queue, lock, max_capacity=10000)`` as in AWorld.

    Args:
        data_dict: where the storages that share rows meet: a ``Manager().dict()`` (AWorld's pattern), a plain
            ``dict`` (shared with forked children and with the processes a storage is pickled to) or ``None``
            (this storage alone; share it by handing it to processes). The first storage built on it records
            its folder there; every later one, in any process, attaches to that folder.
        fifo_queue, lock: accepted so AWorld's code runs, and not used: writers take an ``flock`` the kernel
            releases if they die (a Manager's lock stays held by a killed writer).
        max_capacity: rows held at most (whole oldest tasks evicted first). Storages sharing a folder must
            agree on it.
        path: the folder (default: a temporary one). A ``data_dict`` that already records another folder
            raises.

    A temporary folder recorded in a ``Manager().dict()`` lives as long as the Manager (as AWorld's rows did)
    once a storage on that dict was built in the process that made the Manager; if none ever is, it stays
    until ``objectrl-buffer clean`` removes it once no process uses it (it is named
    ``objectrl-tasks-<pid>-*`` under the temporary directory; pass ``path`` to choose it). With a plain
    ``dict`` it is removed with the storage that made it, as
    :class:`SharedTaskStorage`'s.

    Raises:
        InvalidArgumentError: naming ``data_dict`` when it cannot record a folder (not a dict or a Manager's
            dict proxy, or it maps :data:`FOLDER_KEY` to something that is not a path), naming ``path`` when
            it differs from the recorded folder, or naming ``max_capacity`` when it differs from the folder's.
    """

    def __init__(
        self,
        data_dict: Any = None,
        fifo_queue: Any = None,
        lock: Any = None,
        max_capacity: int = 10000,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        if data_dict is None:
            super().__init__(max_capacity=max_capacity, path=path)
            return
        if not all(callable(getattr(data_dict, m, None)) for m in ("get", "setdefault")):
            raise InvalidArgumentError(
                "data_dict must be a dict or a multiprocessing Manager().dict() shared by the processes, "
                f"got {_brief(data_dict)}"
            )
        wanted = None if path is None else folder(path, "path")
        recorded = data_dict.get(FOLDER_KEY)
        made = None
        if recorded is None:
            made = shm_files.new_folder(shm_files.TASKS_PREFIX) if wanted is None else wanted
            recorded = data_dict.setdefault(FOLDER_KEY, made)  # one call to the Manager: the first writer wins
            if recorded != made and wanted is None:
                os.rmdir(made)  # another process recorded its folder first
                made = None
            elif wanted is None:
                data_dict[_TEMPORARY_KEY] = made  # any storage where the Manager lives may tie it to the Manager
        if not isinstance(recorded, str) or not recorded:
            raise InvalidArgumentError(f"data_dict[{FOLDER_KEY!r}] must be a folder path, got {_brief(recorded)}")
        if wanted is not None and os.path.abspath(wanted) != os.path.abspath(recorded):
            raise InvalidArgumentError(
                f"path={wanted!r} differs from the folder {recorded!r} that data_dict already shares"
            )
        try:
            super().__init__(max_capacity=max_capacity, path=recorded)
        except BaseException:
            if made is not None and wanted is None:
                with contextlib.suppress(Exception):
                    data_dict.pop(FOLDER_KEY, None)
                shutil.rmtree(made, ignore_errors=True)
            raise
        manager = getattr(data_dict, "_manager", None)  # set on a Manager's proxies where the Manager was made
        server = getattr(manager, "_process", None)
        if manager is not None and getattr(server, "_parent_pid", None) == os.getpid():
            if wanted is None and data_dict.get(_TEMPORARY_KEY) == recorded:  # made here or by another process
                weakref.finalize(manager, _remove_folder, recorded, os.getpid())
        elif made is not None and wanted is None and isinstance(data_dict, dict):
            weakref.finalize(self, _remove_folder, made, os.getpid())
