"""A buffer whose writes and samples go through a :class:`~objectrl_buffer.flow.limiter.RateLimiter`.

:func:`limited` wraps any buffer with ObjectRL's ``add`` / ``add_batch`` / ``sample_batch`` (a
:class:`~objectrl_buffer.ReplayBuffer`, a :class:`~objectrl_buffer.PrioritizedReplayBuffer`): each of those
takes ``timeout=`` and is admitted by the limiter as a whole (a batch is all or nothing); everything else
(``update_priority``, ``save``, ``load``, ``len``, ...) is the buffer's own. The limiter joins the buffer's
``checkpoint_extras``, so ``save(data=True)`` and ``load`` keep its counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow.limiter import RateLimiter

__all__ = ["LimitedBuffer", "limited", "batch_rows", "Gate"]


def batch_rows(batch: Any, num_envs: int = 1) -> int:
    """Rows an ``add_batch(batch)`` writes: ``N`` of a ``[N]`` batch (``T * num_envs`` of ``[T, num_envs]``);
    0 when it cannot be told (the write itself then refuses the batch)."""
    if isinstance(batch, TensorDictBase):
        shape = tuple(batch.batch_size)
    elif isinstance(batch, Mapping) and batch:
        first = next(iter(batch.values()))
        shape = tuple(getattr(first, "shape", ())) or ((len(first),) if hasattr(first, "__len__") else ())
    else:
        return 0
    if not shape:
        return 0
    return shape[0] * (num_envs if num_envs > 1 else 1)


class LimitedBuffer:
    """``buffer`` with ``add`` / ``add_batch`` / ``sample_batch`` admitted by ``limiter`` (see :func:`limited`).

    Attributes:
        buffer: the wrapped buffer (write through this wrapper to keep the counters right).
        limiter: the rate limiter.
    """

    def __init__(self, buffer: Any, limiter: RateLimiter) -> None:
        if not isinstance(limiter, RateLimiter):
            raise InvalidArgumentError(f"limiter must be a RateLimiter, got {type(limiter).__name__}")
        for method in ("add", "add_batch", "sample_batch", "checkpoint_extras"):
            if not hasattr(buffer, method):
                raise InvalidArgumentError(f"buffer has no {method!r}: {type(buffer).__name__} cannot be limited")
        self.buffer = buffer
        self.limiter = limiter
        extras = buffer.checkpoint_extras
        if any(getattr(extra, "name", None) == limiter.name for extra in extras):
            raise InvalidArgumentError("buffer already has a rate limiter in its checkpoint_extras")
        extras.append(limiter)

    def __objectrl_holds__(self) -> tuple[Any, ...]:
        """What a ``fork`` child handed this wrapper must share (:data:`objectrl_buffer.forks.HOLDS`): the
        buffer's rows and the limiter's counters, as ``multiprocessing``'s pickler shares them under ``spawn``."""
        return self.buffer, self.limiter

    def __getattr__(self, name: str) -> Any:
        try:
            buffer = self.__dict__["buffer"]
        except KeyError:  # during unpickling, before __dict__ is filled
            raise AttributeError(name) from None
        return getattr(buffer, name)

    def __len__(self) -> int:
        return len(self.buffer)

    def __repr__(self) -> str:
        return f"limited({self.buffer!r}, {self.limiter!r})"

    def _write(self, n: int, timeout: float | None, write: Any, value: Any) -> None:
        buffer = self.buffer
        before = len(buffer)
        if n == 0:  # nothing to admit (or a batch the write refuses): the write decides
            write(value)
            return
        with self.limiter.inserting(n, timeout):
            write(value)
            evicted = min(n, before + n - len(buffer))
        if evicted > 0:  # counted once the inserts are: deletes never pass inserts
            self.limiter.delete(evicted, clamp=True)

    def add(self, transition: Any, *, timeout: float | None = None) -> None:
        """The buffer's ``add`` (``num_envs`` rows), once the limiter admits them.

        Raises:
            RateLimitTimeout, RateLimitDeadlock: not admitted (nothing written or counted); or as the buffer's.
        """
        self._write(self.buffer.num_envs, timeout, self.buffer.add, transition)

    def add_batch(self, batch: Any, *, timeout: float | None = None) -> None:
        """The buffer's ``add_batch``, admitted as a whole. Raises as :meth:`add`."""
        self._write(batch_rows(batch, self.buffer.num_envs), timeout, self.buffer.add_batch, batch)

    def sample_batch(self, batch_size: int, *, timeout: float | None = None, **kwargs: Any) -> TensorDict:
        """The buffer's ``sample_batch(batch_size, **kwargs)`` once ``batch_size`` samples are admitted.

        Raises:
            RateLimitTimeout, RateLimitDeadlock: not admitted (nothing drawn, the generator untouched);
                or as the buffer's (nothing counted).
        """
        k = positive_int(batch_size, "batch_size")
        with self.limiter.sampling(k, timeout):
            return self.buffer.sample_batch(k, **kwargs)

    def reset(self, *args: Any, **kwargs: Any) -> None:
        """The buffer's ``reset``; the limiter's counters start again from zero."""
        self.buffer.reset(*args, **kwargs)
        self.limiter.reset()


class Gate:
    """The rate-limited ``add``/``add_batch``/``sample_batch`` of a buffer built with ``rate_limiter=``:
    :meth:`install` puts them on the buffer instance, over its class's own methods (a shared buffer's
    included), so that ``buffer.add(x, timeout=1.0)`` waits for admission. A batch is admitted whole;
    rows a full ring overwrites are counted as deletes."""

    def __init__(self, buffer: Any, limiter: RateLimiter) -> None:
        self.buffer, self.limiter = buffer, limiter

    def __objectrl_holds__(self) -> tuple[Any, ...]:
        """What a ``fork`` child handed this gate (a buffer's bound ``add``) must share
        (:data:`objectrl_buffer.forks.HOLDS`): the buffer, whose sharing takes its ``rate_limiter`` along."""
        return self.buffer, self.limiter

    def install(self) -> None:
        buffer, limiter = self.buffer, self.limiter
        extras = buffer.checkpoint_extras
        if not any(extra is limiter for extra in extras):
            if any(getattr(extra, "name", None) == limiter.name for extra in extras):
                raise InvalidArgumentError("buffer already has a rate limiter in its checkpoint_extras")
            extras.append(limiter)
        buffer.__dict__.update(add=self.add, add_batch=self.add_batch, sample_batch=self.sample_batch)

    def _write(self, n: int, timeout: float | None, write: Any, value: Any) -> None:
        if n == 0:  # nothing to admit (or a batch the write refuses): the write decides
            write(value)
            return
        buffer = self.buffer
        before = len(buffer)
        with self.limiter.inserting(n, timeout):
            write(value)
        evicted = min(n, before + n - buffer.buffer_size)
        if evicted > 0:
            self.limiter.delete(evicted, clamp=True)

    def add(self, transition: Any, *, timeout: float | None = None) -> None:
        """The buffer's ``add`` once the limiter admits its rows. Raises ``RateLimitTimeout``,
        ``RateLimitDeadlock`` (nothing written or counted), or as the buffer's ``add``."""
        buffer = self.buffer
        self._write(buffer.num_envs, timeout, type(buffer).add.__get__(buffer), transition)

    def add_batch(self, batch: Any, *, timeout: float | None = None) -> None:
        """The buffer's ``add_batch``, admitted as a whole. Raises as :meth:`add`."""
        buffer = self.buffer
        self._write(batch_rows(batch, buffer.num_envs), timeout, type(buffer).add_batch.__get__(buffer), batch)

    def sample_batch(self, batch_size: int, *, timeout: float | None = None, **kwargs: Any) -> TensorDict:
        """The buffer's ``sample_batch`` once ``batch_size`` samples are admitted (nothing drawn otherwise)."""
        k = positive_int(batch_size, "batch_size")
        buffer = self.buffer
        with self.limiter.sampling(k, timeout):
            return type(buffer).sample_batch(buffer, k, **kwargs)


def limited(buffer: Any, limiter: RateLimiter) -> LimitedBuffer:
    """``buffer`` rate-limited by ``limiter``: ``add``/``add_batch``/``sample_batch`` take ``timeout=`` and
    wait for admission; the limiter's counters join the buffer's full checkpoints (extra state
    ``"rate_limiter"``).

    Raises:
        InvalidArgumentError: ``limiter`` is not a RateLimiter, or the buffer has one already.
    """
    return LimitedBuffer(buffer, limiter)
