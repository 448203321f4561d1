"""Exceptions raised by objectrl_buffer.

Every class subclasses both :class:`ReplayBufferError` (catch everything from this
library) and the builtin that code written against ObjectRL's buffer already catches,
so ``except ValueError`` or ``except IndexError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ReplayBufferError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "SchemaError",
    "EmptyBufferError",
    "SlotIndexError",
    "StaleIteratorError",
    "ClosedBufferError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CastWarning",
    "VectorStepWarning",
    "PartialCheckpointWarning",
    "BufferFull",
    "InconsistentStateError",
    "QueryError",
    "ConcurrentUseError",
    "RateLimitTimeout",
    "RateLimitDeadlock",
    "BufferUnavailable",
    "ForkedBufferError",
]


class ReplayBufferError(Exception):
    """Base class of every error raised on purpose by objectrl_buffer."""


class InvalidArgumentError(ReplayBufferError, ValueError):
    """An argument is out of its documented range (a size <= 0, a batch of the wrong rank, ...)."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument or field of the wrong type where earlier releases raised a plain ``TypeError``: a task row's
    ``exp_meta.task_id`` that is not a str, a ``step`` that is not a real number, a payload value no JSON form
    holds. An :class:`InvalidArgumentError` (so a ``ValueError``) that ``except TypeError`` still catches;
    the message names the field."""


class SchemaError(ReplayBufferError, ValueError):
    """A write does not match the stored schema (keys, per-row shapes, dtypes).

    The message names the key, what the buffer stores and what the write brought.
    Nothing of the rejected write is stored.
    """


class EmptyBufferError(ReplayBufferError, RuntimeError):
    """Sampling was asked of a buffer that holds no rows (or only metadata, no data)."""


class SlotIndexError(ReplayBufferError, IndexError):
    """An index does not name a stored slot (``0 <= index < len(buffer)``)."""


class StaleIteratorError(ReplayBufferError, RuntimeError):
    """An epoch iterator was advanced after the buffer it reads was reset."""


class ClosedBufferError(ReplayBufferError, RuntimeError):
    """A write reached a buffer after its ``close()``: its storage is gone for good."""


class ConcurrentUseError(ReplayBufferError, RuntimeError):
    """A read kept meeting another thread's writes to the very rows it read (one writer thread and
    sampler threads are supported, a read re-reads rows overwritten meanwhile, but not forever);
    the message names the reading thread.

    Also raised by an ``AsyncSequenceBuffer`` awaited on a second event loop while it is bound to another
    (see :mod:`objectrl_buffer.async_buffer.loop`); nothing changed, the message names both threads."""


class CheckpointError(ReplayBufferError, RuntimeError):
    """Saving or loading failed; the message names the path and the problem.

    An ``OSError`` from the disk is chained as ``__cause__``.
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint (its ``.metadata`` file or its data) does not exist."""


class BufferFull(ReplayBufferError, RuntimeError):
    """A put brought more samples than an asynchronous buffer has free slots; nothing of it was stored.

    The message names the batch size, the entries held and the capacity (``max_size``).
    """


class InconsistentStateError(ReplayBufferError, AssertionError):
    """A buffer's ``check_invariants()`` found two pieces of its state that disagree (a bug: please report it).

    Subclasses ``AssertionError``, what upstream's plain ``assert`` checks raised.
    """


class RateLimitTimeout(ReplayBufferError, TimeoutError):
    """A rate-limited insert or sample was not admitted within its ``timeout``; nothing changed (no rows
    written or drawn, the limiter's counters as before). The message names the call, ``n`` and the counters."""


class RateLimitDeadlock(ReplayBufferError, RuntimeError):
    """A rate-limited call would wait forever: nothing can ever change the limiter's counters (no other live
    party that is not itself waiting), or the call asks for more than the limiter's window admits at once.
    Nothing changed; see :mod:`objectrl_buffer.flow` for the rule."""


class BufferUnavailable(ReplayBufferError, ConnectionError):
    """A remote buffer's shard (or its coordinator) stayed unreachable through every retry: its actor died for
    good or did not come back within ``retry_timeout_s``. The message names the shard and the call; a write
    that raised this may or may not be stored (retry it with the same writer: it is applied at most once).

    Raised by a :class:`~objectrl_buffer.distributed.remote.Writer`, ``undelivered_rows`` counts the rows that
    writer accepted and still holds, undelivered (sent again by its next ``add``, ``flush`` or ``close``)."""

    #: rows a writer accepted and could not deliver (0 when not raised by a writer)
    undelivered_rows: int = 0


class ForkedBufferError(ReplayBufferError, RuntimeError):
    """A write (``add``, ``add_batch``, ``extend``, ``reset``, ``load``, ``load_state_dict``) reached a CPU buffer
    that this process inherited through ``fork`` without it being shared first. Its rows are the parent's
    memory-mapped files while its counters are this process's private copy, so the write would overwrite the
    parent's rows behind its back. Nothing was written; reads still work. The message says how to share it
    (see :mod:`objectrl_buffer.distributed.process`)."""


class CastWarning(UserWarning):
    """A tensor was stored in a column of another dtype or per-row shape (a lossless cast or a reshape
    over size-1 dimensions). Issued once per key per buffer; NumPy values and Python numbers, which
    never carry a column's exact type, are cast without it."""


class VectorStepWarning(UserWarning):
    """The first write of a ``num_envs=1`` buffer looks like one step of ``E`` vector envs: every key has
    the same leading size ``E > 1``, the per-step scalars (``reward``, ``terminated``, ``truncated``,
    ``done``) included. Each row would then hold all ``E`` envs, and n-step returns and slices would mix
    them: build the buffer with ``num_envs=E`` (or write ``add_batch`` rows). Issued once per buffer, at
    its first write; silence it with ``warnings.filterwarnings("ignore", category=VectorStepWarning)``
    when rows of ``E`` really are one transition."""


class PartialCheckpointWarning(UserWarning):
    """A checkpoint holds fewer trajectories than were added: ``save_checkpoint`` of a
    :class:`~objectrl_buffer.trajectory.TrajectoryReplayBuffer` that keeps only its sample window (built without
    ``save_trajectories`` and without ``capacity``) writes the newest ``sample_window_size`` trajectories it
    still holds; the others are gone. The folder's ``metadata.json`` says so (``num_added``, ``kept``). Build
    the buffer with ``save_trajectories=True`` (or ``capacity=``) to checkpoint more."""


class QueryError(ReplayBufferError, ValueError):
    """A task-buffer query cannot be run: an unknown operator or field, ordering a string field, an ``in_``
    value that is not a collection, a ``like`` pattern that is not a string. The message names it."""
