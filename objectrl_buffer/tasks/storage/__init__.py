"""Task storages: AWorld's interface, in memory, and shared between processes."""

from .base import InMemoryStorage, Storage, TableStorage
from .multi_proc_mem import MultiProcMemoryStorage
from .shared import SharedTaskStorage

__all__ = ["Storage", "TableStorage", "InMemoryStorage", "SharedTaskStorage", "MultiProcMemoryStorage"]
