"""The asynchronous sequence buffer between rollout, reward and training workers (AReaL's job).

Producers ``put_batch`` sequences, services ``amend_batch`` them with new keys, consumers ``get_batch``
the oldest entries that hold their keys; an entry is freed once every consumer has read it. A key may hold
several sequences per sample, or only their lengths (:class:`Sequences`); ids may be ints or str.
"""

from objectrl_buffer.async_buffer.buffer import AsyncIOSequenceBuffer, AsyncSequenceBuffer
from objectrl_buffer.async_buffer.consumer import Consumer
from objectrl_buffer.async_buffer.sequences import Sequences
from objectrl_buffer.errors import BufferFull

__all__ = ["AsyncSequenceBuffer", "AsyncIOSequenceBuffer", "Consumer", "Sequences", "BufferFull"]
