"""``aworld.replay_buffer.storage``: :mod:`.multi_proc_mem` and :mod:`.redis` (the latter needs the ``redis``
extra)."""
