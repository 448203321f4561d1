"""Many writers, one buffer: shared by the processes of one machine (:mod:`.shared`), or served by Ray
actors (:mod:`.remote`, the ``ray`` extra; Ray is imported only when a remote buffer is launched)."""

from objectrl_buffer.distributed.process import become_shared, is_shared
from objectrl_buffer.distributed.remote import RemoteBuffer, Writer
from objectrl_buffer.distributed.shared import SharedBuffer, share

__all__ = ["SharedBuffer", "share", "become_shared", "is_shared", "RemoteBuffer", "Writer"]
