"""AWorld's ``MultiProcMemoryStorage`` under its name and module path, as a thin constructor over
:class:`SharedTaskStorage` (rows in files under a kernel-released lock, instead of a Manager's pickles)."""

from __future__ import annotations

import os
from typing import Any

from .shared import SharedTaskStorage

__all__ = ["MultiProcMemoryStorage"]


class MultiProcMemoryStorage(SharedTaskStorage):
    """``MultiProcMemoryStorage(data_dict, fifo_queue, lock, max_capacity=10000)`` as in AWorld.

    ``data_dict``, ``fifo_queue`` and ``lock`` (a Manager's dict, list and lock upstream) are accepted so
    ported code runs, and are not used: the rows live in a folder (``path``, or a temporary one) shared by
    every process the storage is handed to, and writers take an ``flock`` the kernel releases if they die.
    """

    def __init__(
        self,
        data_dict: Any = None,
        fifo_queue: Any = None,
        lock: Any = None,
        max_capacity: int = 10000,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(max_capacity=max_capacity, path=path)
