"""AWorld's replay buffer (``aworld.replay_buffer``) over :mod:`objectrl_buffer.tasks`, module for module:
replace ``aworld.replay_buffer`` with ``objectrl_buffer.compat.aworld`` in the imports and the rest of the code
runs as it is.

=========================================================  ===================================================
AWorld                                                     here
=========================================================  ===================================================
``aworld.replay_buffer``                                   :mod:`objectrl_buffer.compat.aworld`
``aworld.replay_buffer.base``                              :mod:`objectrl_buffer.compat.aworld.base`
``aworld.replay_buffer.query_filter``                      :mod:`objectrl_buffer.compat.aworld.query_filter`
``aworld.replay_buffer.storage.multi_proc_mem``            :mod:`objectrl_buffer.compat.aworld.storage.multi_proc_mem`
``aworld.replay_buffer.storage.redis``                     :mod:`objectrl_buffer.compat.aworld.storage.redis`
=========================================================  ===================================================

Not provided: ``EventReplayBuffer``, ``processor`` (trace-span export) and ``storage.odps``. What differs on
purpose (each row counted once, a fresh storage per buffer, SQL ``LIKE``, queries that raise instead of
matching nothing) is listed in ``docs/migration/aworld.md``.
"""

from .base import DataRow, Experience, ExpMeta, ReplayBuffer

__all__ = ["ReplayBuffer", "DataRow", "ExpMeta", "Experience"]
