"""Many writers, one buffer: shared by the processes of one machine (:mod:`.shared`; pixel buffers with
``next_of``/``frame_stack`` stay compact there: :mod:`.shared_compact`), or served by Ray actors
(:mod:`.remote`, the ``ray`` extra; Ray is imported only when a remote buffer is launched)."""

from objectrl_buffer.distributed.process import become_shared, is_shared
from objectrl_buffer.distributed.remote import RemoteBuffer, Writer
from objectrl_buffer.distributed.shared import SharedBuffer, share
from objectrl_buffer.distributed.shared_compact import SharedCompactBuffer

__all__ = ["SharedBuffer", "SharedCompactBuffer", "share", "become_shared", "is_shared", "RemoteBuffer", "Writer"]
