"""``aworld.replay_buffer.storage.multi_proc_mem``: ``MultiProcMemoryStorage(data_dict, fifo_queue, lock,
max_capacity)``. Every storage built on the same ``data_dict`` (a ``Manager().dict()``), in any process, and
every process the storage is handed to, shares the same rows (see
:class:`objectrl_buffer.tasks.storage.multi_proc_mem.MultiProcMemoryStorage`)."""

from objectrl_buffer.tasks.storage.multi_proc_mem import MultiProcMemoryStorage

__all__ = ["MultiProcMemoryStorage"]
