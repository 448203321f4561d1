"""Many writers, one buffer: a buffer shared by the processes of one machine (:mod:`.shared`)."""

from objectrl_buffer.distributed.shared import SharedBuffer, share

__all__ = ["SharedBuffer", "share"]
