"""A samples-per-insert rate limiter with Reverb's semantics, for threads of one process and asyncio.

Counters: ``inserts`` (rows admitted), ``samples`` (rows drawn: a batch of 256 counts 256) and ``deletes``
(rows evicted; ``inserts - deletes`` is the size the limiter sees). With ``diff = inserts * spi - samples``:

* ``n`` inserts are admitted when ``inserts + n - deletes <= min_size_to_sample`` (filling up is free), or
  else when ``(inserts + n) * spi - samples <= max_diff``;
* ``n`` samples are admitted when ``inserts - deletes >= min_size_to_sample`` and
  ``inserts * spi - samples - n >= min_diff``.

Blocking calls (:meth:`RateLimiter.insert`, :meth:`RateLimiter.sample`, and the context managers
:meth:`RateLimiter.inserting` / :meth:`RateLimiter.sampling` that a buffer wraps its write or read in) wait
until admitted, all ``n`` at once or nothing. ``timeout`` seconds without admission raise
:class:`~objectrl_buffer.errors.RateLimitTimeout` and change nothing.

Deadlocks (the rule): the counters only move when a party calls the limiter. A *party* is a live thread
that has called it (or :meth:`RateLimiter.register`-ed). A blocked call raises
:class:`~objectrl_buffer.errors.RateLimitDeadlock` when, for ``deadlock_after_s`` seconds in a row, every
other party is dead or itself blocked in a call (so nobody is left who could ever move the counters), or at
once when ``n`` is more than the limiter can ever admit in one call (``n * spi > max_diff - min_diff`` for
inserts past ``min_size_to_sample``, ``n > max_diff - min_diff`` for samples). The typical catch: a single
thread that samples before anything was inserted, or inserts past the ratio while nobody samples. Threads
that start later should ``register()`` first (or the grace ``deadlock_after_s`` must cover their start);
``deadlock_after_s=None`` turns detection off. Asyncio waiters are never declared deadlocked (another
coroutine of their loop may still move the counters); give them a ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from objectrl_buffer.checkpoint.extras import Arrays, Values
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.core.sync import ProcessRLock
from objectrl_buffer.core.validate import MAX_SIZE, positive_int, real_in
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError, RateLimitDeadlock, RateLimitTimeout
from objectrl_buffer.storage import shm_files

__all__ = ["RateLimiter", "NAME", "BIG", "MAX_COUNT", "unshared"]

#: The extra-state name of a limiter's counters in full checkpoints.
NAME = "rate_limiter"
#: What unbounded diffs are clamped to (checkpoint JSON has no infinities).
BIG = sys.float_info.max
_POLL_S = 0.05  # how often a blocked call re-checks the deadlock rule
_SHARED_POLL_S = 0.002  # how often a blocked call of a shared limiter re-checks (other processes never notify)
_COUNTERS = ("inserts", "samples", "deletes")
#: The most any counter may reach (int64 counters; what a checkpoint's counters may hold, so every count saved loads).
MAX_COUNT = MAX_SIZE


def _count(value: Any, name: str) -> int:
    if value == 0 and not isinstance(value, bool) and isinstance(value, int):
        return 0
    return positive_int(value, name)


def _timeout(timeout: float | None) -> float | None:
    return None if timeout is None else real_in(timeout, "timeout", 0.0, math.inf)


class RateLimiter:
    """Admit inserts and samples so that ``samples / inserts`` stays near ``samples_per_insert``.

    Args:
        samples_per_insert: ``spi`` (> 0, finite): samples each inserted row should see on average.
        min_size_to_sample: rows (``inserts - deletes``) needed before any sample (>= 1).
        min_diff, max_diff: the allowed range of ``inserts * spi - samples`` (``min_diff <= max_diff``;
            infinities are clamped to the largest float).
        deadlock_after_s: how long a blocked call may find nobody able to unblock it before it raises
            :class:`~objectrl_buffer.errors.RateLimitDeadlock` (``0``: at once; ``None``: never).

    Raises:
        InvalidArgumentError: an argument out of range, naming it.

    Thread-safe. The counters are this buffer's extra state ``"rate_limiter"`` when the limiter is in a
    buffer's ``checkpoint_extras`` (:func:`objectrl_buffer.flow.limited` puts it there), so a full
    checkpoint and its load keep the ratio; a metadata-only one (ObjectRL's ``save(path)``) carries the
    counters too (``metadata_keys``; one saved before that restores as :meth:`restore` says).
    """

    name = NAME
    #: The counters a metadata-only checkpoint (ObjectRL's ``save(path)``) carries too (see
    #: :mod:`objectrl_buffer.checkpoint.extras`).
    metadata_keys = _COUNTERS

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
        *,
        deadlock_after_s: float | None = 1.0,
    ) -> None:
        self.samples_per_insert = real_in(samples_per_insert, "samples_per_insert", 0.0, math.inf, finite=True)
        if self.samples_per_insert <= 0:
            raise InvalidArgumentError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
        self.min_size_to_sample = positive_int(min_size_to_sample, "min_size_to_sample")
        low = max(real_in(min_diff, "min_diff", -math.inf, math.inf), -BIG)
        high = min(real_in(max_diff, "max_diff", -math.inf, math.inf), BIG)
        if low > high:
            raise InvalidArgumentError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.min_diff, self.max_diff = low, high
        self.deadlock_after_s = _timeout(deadlock_after_s) if deadlock_after_s is not None else None
        self._counts = np.zeros(3, dtype=np.int64)  # inserts, samples, deletes
        self._shared: str | None = None  # the file of the counters once shared with other processes
        self._init_sync()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ForkingPickler.register(cls, _reduce_for_process)

    inserts = property(lambda self: int(self._counts[0]), lambda self, v: self._counts.__setitem__(0, v))
    samples = property(lambda self: int(self._counts[1]), lambda self, v: self._counts.__setitem__(1, v))
    deletes = property(lambda self: int(self._counts[2]), lambda self, v: self._counts.__setitem__(2, v))

    def _init_sync(self) -> None:
        self._lock = ProcessRLock(self._shared)  # share() makes it exclude processes too, under its waiters
        lock: Any = self._lock  # a threading.Condition takes any lock with its protocol
        self._cond = threading.Condition(lock)
        if self._shared is None:
            _UNSHARED.add(self)
        self._poll_s = _POLL_S if self._shared is None else _SHARED_POLL_S
        self._parties: dict[int, threading.Thread] = {}
        self._blocked: dict[int, int] = {}  # thread ident -> calls of it waiting (1 unless re-entered)
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._rows_restored = 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, max_diff={self.max_diff}, "
            f"inserts={self.inserts}, samples={self.samples}, deletes={self.deletes})"
        )

    # ------------------------------------------------------------------ Reverb's rules
    @property
    def size(self) -> int:
        """Rows the limiter counts as held: ``inserts - deletes``."""
        return self.inserts - self.deletes

    @property
    def waiting(self) -> int:
        """Calls blocked in this limiter now: waiting threads plus waiting coroutines (async admissions)."""
        return sum(self._blocked.values()) + len(self._async_waiters)

    @property
    def diff(self) -> float:
        """``inserts * samples_per_insert - samples``."""
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int = 1) -> bool:
        """Whether ``n`` inserts would be admitted now (Reverb's ``CanInsert``)."""
        if self.inserts + n - self.deletes <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int = 1) -> bool:
        """Whether ``n`` samples would be admitted now (Reverb's ``CanSample``)."""
        if self.inserts - self.deletes < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - self.samples - n >= self.min_diff

    def _never(self, n: int, inserting: bool) -> bool:
        """Whether ``n`` can never be admitted in one call, whatever the others do."""
        width = self.max_diff - self.min_diff
        if inserting:
            return self.inserts + n - self.deletes > self.min_size_to_sample and n * self.samples_per_insert > width
        return n > width

    # ------------------------------------------------------------------ non-blocking
    def try_insert(self, n: int = 1) -> bool:
        """Count ``n`` inserts if admitted now; ``False`` (nothing counted) otherwise.

        Raises:
            InvalidArgumentError: ``n`` not a positive int, or ``inserts + n`` past :data:`MAX_COUNT` (checked
                under the lock that every process sharing the counters takes; nothing counted).
        """
        return self._try(n, inserting=True)

    def try_sample(self, n: int = 1) -> bool:
        """Count ``n`` samples if admitted now; ``False`` (nothing counted) otherwise. Raises as :meth:`try_insert`."""
        return self._try(n, inserting=False)

    def _try(self, n: int, inserting: bool) -> bool:
        n = positive_int(n, "n")
        with self._cond:
            self._join()
            self._check_room(n, inserting)
            if not (self.can_insert(n) if inserting else self.can_sample(n)):
                return False
            if inserting:
                self.inserts += n
            else:
                self.samples += n
            self._changed()
            return True

    # ------------------------------------------------------------------ blocking
    def insert(self, n: int = 1, timeout: float | None = None) -> None:
        """Wait until ``n`` inserts are admitted, then count them.

        Raises:
            RateLimitTimeout: not admitted within ``timeout`` seconds (nothing counted).
            RateLimitDeadlock: it could never be admitted (see the module docs; nothing counted).
            InvalidArgumentError: as :meth:`try_insert`.
        """
        with self.inserting(n, timeout):
            pass

    def sample(self, n: int = 1, timeout: float | None = None) -> None:
        """Wait until ``n`` samples are admitted, then count them. Raises as :meth:`insert`."""
        with self.sampling(n, timeout):
            pass

    @contextmanager
    def inserting(self, n: int, timeout: float | None = None) -> Iterator[None]:
        """Wait until ``n`` inserts are admitted and hold the limiter for the block; the inserts are
        counted only if the block ends without an exception (a write that fails counts nothing).
        Raises as :meth:`insert` before the block runs."""
        n, timeout = positive_int(n, "n"), _timeout(timeout)
        with self._cond:
            self._await(n, timeout, inserting=True)
            yield
            self.inserts += n
            self._changed()

    @contextmanager
    def sampling(self, n: int, timeout: float | None = None) -> Iterator[None]:
        """As :meth:`inserting`, for ``n`` samples."""
        n, timeout = positive_int(n, "n"), _timeout(timeout)
        with self._cond:
            self._await(n, timeout, inserting=False)
            yield
            self.samples += n
            self._changed()

    def record_inserts(self, n: int) -> None:
        """Count ``n >= 0`` inserts that were made without this limiter's admission, at once (no wait, no ratio
        check): rows another admission let in that this limiter must still count (see
        :mod:`objectrl_buffer.distributed.tickets`).

        Raises:
            InvalidArgumentError: ``n`` not an int >= 0, or ``inserts + n`` past :data:`MAX_COUNT` (nothing
                counted).
        """
        n = _count(n, "n")
        if not n:
            return
        with self._cond:
            self._check_room(n, inserting=True)
            self.inserts += n
            self._changed()

    def delete(self, n: int, *, clamp: bool = False) -> int:
        """Count ``n >= 0`` rows evicted (a full ring overwrote them); return the deletes counted. ``clamp``
        (a buffer's gate): count at most :attr:`size` (rows the limiter never counted are not its to delete).

        Raises:
            InvalidArgumentError: ``n > size`` without ``clamp`` (nothing counted: ``deletes > inserts``
                would make every later checkpoint unloadable).
        """
        n = _count(n, "n")
        if not n:
            return 0
        with self._cond:
            size = self.inserts - self.deletes
            if n > size:
                if not clamp:
                    raise InvalidArgumentError(
                        f"rate limiter: delete of n={n} rows but only {size} are counted as held "
                        f"({self._counters()}); nothing was counted"
                    )
                n = max(0, size)
            if n:
                self.deletes += n
                self._changed()
            return n

    def reset(self) -> None:
        """Zero the counters (the buffer was emptied)."""
        with self._cond:
            self.inserts = self.samples = self.deletes = 0
            self._changed()

    def register(self) -> None:
        """Declare the calling thread a party before its first call (see the deadlock rule)."""
        with self._cond:
            self._join()

    # ------------------------------------------------------------------ asyncio
    async def insert_async(self, n: int = 1, timeout: float | None = None) -> None:
        """:meth:`insert` for a coroutine: waits without blocking its event loop. Raises ``RateLimitTimeout``."""
        await self._await_async(n, timeout, inserting=True)

    async def sample_async(self, n: int = 1, timeout: float | None = None) -> None:
        """:meth:`sample` for a coroutine. Raises ``RateLimitTimeout``."""
        await self._await_async(n, timeout, inserting=False)

    async def _await_async(self, n: int, timeout: float | None, inserting: bool) -> None:
        n, timeout = positive_int(n, "n"), _timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = self.try_insert if inserting else self.try_sample
        while True:
            with self._cond:  # try and enlist under one lock: no wake-up is lost in between
                if attempt(n):
                    return
                if self._never(n, inserting):
                    raise self._impossible(n, inserting)
                waiter = (loop, loop.create_future())
                self._async_waiters.add(waiter)
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                poll = self._shared is not None and (left is None or left > self._poll_s)
                try:
                    await asyncio.wait_for(waiter[1], self._poll_s if poll else left)
                except asyncio.TimeoutError:
                    if not poll:
                        raise self._timed_out(n, inserting, timeout) from None
            finally:
                with self._cond:
                    self._async_waiters.discard(waiter)

    # ------------------------------------------------------------------ waiting
    def _join(self) -> None:
        me = threading.current_thread()
        self._parties.setdefault(me.ident or 0, me)

    def _changed(self) -> None:
        self._cond.notify_all()
        for loop, future in list(self._async_waiters):
            loop.call_soon_threadsafe(_wake, future)

    def _stuck(self, me: int) -> bool:
        """No live party but ``me`` that is not waiting: nobody can move the counters."""
        for ident, thread in list(self._parties.items()):
            if not thread.is_alive():
                del self._parties[ident]
            elif ident != me and not self._blocked.get(ident):
                return False
        return True

    def _check_room(self, n: int, inserting: bool) -> None:
        """Refuse (the lock held) ``n`` that would carry its counter past :data:`MAX_COUNT`."""
        counter = "inserts" if inserting else "samples"
        count = self.inserts if inserting else self.samples
        if count + n > MAX_COUNT:
            raise InvalidArgumentError(
                f"rate limiter: n={n} {counter} would carry {counter} ({count}) past {MAX_COUNT}, the most its "
                "int64 counters hold; nothing was counted"
            )

    def _await(self, n: int, timeout: float | None, inserting: bool) -> None:
        """Wait (the lock held, released while waiting) until ``n`` is admitted."""
        self._join()
        can = self.can_insert if inserting else self.can_sample
        self._check_room(n, inserting)
        if can(n):
            return
        if self._never(n, inserting):
            raise self._impossible(n, inserting)
        me = threading.get_ident()
        deadline = None if timeout is None else time.monotonic() + timeout
        stuck_since: float | None = None
        self._blocked[me] = self._blocked.get(me, 0) + 1
        try:
            while not can(n):
                now = time.monotonic()
                if self.deadlock_after_s is not None and self._shared is None and self._stuck(me):
                    stuck_since = now if stuck_since is None else stuck_since
                    if now - stuck_since >= self.deadlock_after_s:
                        raise self._deadlocked(n, inserting)
                else:
                    stuck_since = None
                if deadline is not None and now >= deadline:
                    raise self._timed_out(n, inserting, timeout)
                wait = self._poll_s if self.deadlock_after_s is not None or self._shared is not None else None
                if deadline is not None:
                    wait = deadline - now if wait is None else min(wait, deadline - now)
                self._cond.wait(wait)
        finally:
            self._blocked[me] -= 1
            if not self._blocked[me]:
                del self._blocked[me]
        self._check_room(n, inserting)  # again once admitted: other processes move shared counters meanwhile

    def _counters(self) -> str:
        return f"inserts={self.inserts}, samples={self.samples}, deletes={self.deletes}, diff={self.diff:g}"

    def _what(self, n: int, inserting: bool) -> str:
        return f"{'insert' if inserting else 'sample'} of n={n}"

    def _timed_out(self, n: int, inserting: bool, timeout: float | None) -> RateLimitTimeout:
        return RateLimitTimeout(
            f"rate limiter: {self._what(n, inserting)} not admitted within timeout={timeout}s ({self._counters()}, "
            f"min_diff={self.min_diff:g}, max_diff={self.max_diff:g}); nothing was counted"
        )

    def _deadlocked(self, n: int, inserting: bool) -> RateLimitDeadlock:
        other = "sampler" if inserting else "writer"
        return RateLimitDeadlock(
            f"rate limiter: {self._what(n, inserting)} would wait forever: no other live {other} (or any party "
            f"not itself blocked) can move the counters ({self._counters()}, min_size_to_sample="
            f"{self.min_size_to_sample}); run the {other} in another thread and register() it, or pass a timeout"
        )

    def _impossible(self, n: int, inserting: bool) -> RateLimitDeadlock:
        return RateLimitDeadlock(
            f"rate limiter: a single {self._what(n, inserting)} can never be admitted: it exceeds the window "
            f"max_diff - min_diff = {self.max_diff - self.min_diff:g} (samples_per_insert="
            f"{self.samples_per_insert:g}); split it into smaller calls"
        )

    # ------------------------------------------------------------------ checkpoints (the extra-state contract)
    def state(self) -> tuple[Arrays, dict[str, ExtraValue]]:
        """The counters and settings as JSON values."""
        with self._cond:
            return {}, {
                "inserts": self.inserts,
                "samples": self.samples,
                "deletes": self.deletes,
                "samples_per_insert": self.samples_per_insert,
                "min_size_to_sample": self.min_size_to_sample,
                "min_diff": self.min_diff,
                "max_diff": self.max_diff,
            }

    def check(self, arrays: Arrays, values: Values, rows: int, source: str) -> None:
        """Refuse saved counters that are not non-negative ints with ``deletes <= inserts``."""
        self._rows_restored = rows
        if not values:
            return
        try:
            counts = [_count(values[key], key) for key in _COUNTERS]
        except (KeyError, InvalidArgumentError) as exc:
            raise CheckpointError(f"'{source}': bad {NAME} counters: {exc}") from None
        if counts[2] > counts[0]:
            raise CheckpointError(f"'{source}': bad {NAME} counters: deletes {counts[2]} > inserts {counts[0]}")

    def restore(self, arrays: Arrays, values: Values) -> None:
        """Adopt saved counters (this limiter keeps its own settings). A checkpoint without them
        counts its rows as inserted and sets ``samples`` so that ``diff`` sits at
        ``min_size_to_sample * spi`` (the ratio's centre): neither side bursts after the load."""
        with self._cond:
            if values:
                self.inserts, self.samples, self.deletes = (int(values[key]) for key in _COUNTERS)
            else:
                rows = self._rows_restored
                self.inserts, self.deletes = rows, 0
                self.samples = max(0, math.floor((rows - self.min_size_to_sample) * self.samples_per_insert))
            self._changed()

    # ------------------------------------------------------------------ buffers
    def attach(self, buffer: Any) -> None:
        """Gate ``buffer``'s ``add``/``add_batch``/``sample_batch`` (they then take ``timeout=``) and add the
        counters to its ``checkpoint_extras``: what ``ReplayBuffer(..., rate_limiter=self)`` does."""
        from objectrl_buffer.flow.limited import Gate

        Gate(buffer, self).install()

    # ------------------------------------------------------------------ copies and processes
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        state.update(inserts=self.inserts, samples=self.samples, deletes=self.deletes)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        counts = [int(state.pop(key, 0)) for key in _COUNTERS]
        self.__dict__.update(state)
        self._counts = np.array(counts, dtype=np.int64)
        self._shared = state.get("_shared")
        self._init_sync()

    def share(self) -> str:
        """Move the counters into a shared file (once: at the first hand-over to a child process, or when its
        buffer becomes shared) and return its path. From then on every process holding this limiter moves
        and reads the same counters under a lock the kernel frees if its holder dies; blocked calls (those
        already waiting too) poll every ~2 ms, and the deadlock rule is off (parties in other processes are
        not seen: give blocking calls a ``timeout``)."""
        with self._cond:
            if self._shared is None:
                fd, path = shm_files.new_file()  # named after this process: see objectrl-buffer clean
                try:
                    os.write(fd, self._counts.tobytes())
                finally:
                    os.close(fd)
                self._finalizer = weakref.finalize(self, _remove_file, path, os.getpid())
                self._counts = torch.from_file(path, shared=True, size=3, dtype=torch.int64).numpy()
                self._lock.use_file(path)  # held here: this hold takes the file lock too
                self._shared, self._poll_s = path, _SHARED_POLL_S
                _UNSHARED.discard(self)
                self._changed()  # waiters re-check under the shared rules (other processes never notify)
                return path
            return self._shared

    def use_counters(self, path: str) -> None:
        """Move and read the counters in the shared file ``path`` (made by :meth:`share` in another process)."""
        self._shared = path
        self._counts = torch.from_file(path, shared=True, size=3, dtype=torch.int64).numpy()
        self._init_sync()
        _UNSHARED.discard(self)


#: This process's limiters whose counters are not shared yet: the fork hook (:mod:`objectrl_buffer.forks`)
#: shares those a forking ``Process`` is handed, as ``multiprocessing``'s pickler does under ``spawn``.
_UNSHARED: weakref.WeakSet[RateLimiter] = weakref.WeakSet()


def unshared() -> list[RateLimiter]:
    """This process's live rate limiters whose counters are not shared yet."""
    return list(_UNSHARED)


def _remove_file(path: str, pid: int) -> None:
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _attached(cls: Any, state: dict[str, Any], path: str) -> RateLimiter:
    limiter: RateLimiter = cls.__new__(cls)
    limiter.__setstate__(state)
    limiter.use_counters(path)
    return limiter


def _reduce_for_process(limiter: RateLimiter) -> tuple[Any, ...]:
    """``multiprocessing``'s pickler only: the child shares this limiter's counters (``pickle`` copies them)."""
    path = limiter.share()
    return _attached, (type(limiter), limiter.__getstate__(), path)


ForkingPickler.register(RateLimiter, _reduce_for_process)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
