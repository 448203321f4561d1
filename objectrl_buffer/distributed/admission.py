"""Asking a remote buffer's coordinator for admission, client-side, before a write or a draw is sent.

A handle (and a :class:`~.writer.Writer`) waits for the coordinator's answer and only then sends the shard
call: a shard never holds a call whose admission is pending (Ray runs a caller's calls to one actor in the
order they were sent, so such a call would hold up every later one of that process, a learner's draws
included), and nothing is ever sent on an admission that did not come. While the coordinator is down (dead,
restarting), the admission is asked again of the restarted actor (never taken from a call that died with the
old one): a write or a draw waits, or raises once its time is up, and is never let through unadmitted.

Time limits:

* with a ``timeout``, the coordinator waits at most ``timeout`` and the caller at most ``timeout`` plus
  :data:`GRACE_S` (the round trip); then :class:`~objectrl_buffer.errors.RateLimitTimeout` (the late call is
  cancelled), also when the coordinator cannot be reached meanwhile;
* without one, the caller waits for the limiter as long as it takes, and a coordinator that keeps failing
  for ``retry_timeout_s`` in a row raises :class:`~objectrl_buffer.errors.BufferUnavailable`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from objectrl_buffer.distributed.ray_import import ray_module
from objectrl_buffer.errors import BufferUnavailable, RateLimitTimeout, ReplayBufferError

__all__ = ["GRACE_S", "Asked", "admit"]

#: Seconds a caller with a ``timeout`` waits beyond it for the coordinator's answer (its round trip).
GRACE_S = 0.25


class Asked:
    """An admission asked at ``start`` (``time.monotonic()``): its Ray ref, and what to ask again with.

    ``ask(timeout)`` sends the call (the coordinator's remaining wait as its argument) and returns its ref.
    """

    def __init__(self, ask: Callable[[float | None], Any], timeout: float | None) -> None:
        self.ask, self.timeout = ask, timeout
        self.start = time.monotonic()
        self.ref: Any = ask(timeout)
        self.admitted = False

    def left(self) -> float | None:
        """Seconds of ``timeout`` left (``None``: no timeout)."""
        return None if self.timeout is None else self.timeout - (time.monotonic() - self.start)

    def ready(self) -> bool:
        """Whether the coordinator has answered (never waits)."""
        return bool(self.ref is not None and ray_module().wait([self.ref], timeout=0)[0])


def admit(asked: Asked, what: str, retry_timeout_s: float) -> str | None:
    """Wait for ``asked``'s admission (see the module docs); asked again while the coordinator is down. The
    admission's ticket (an insert's, see :mod:`.tickets`; ``None``: a sample's, or one admitted before).

    Raises:
        RateLimitTimeout: not admitted within the timeout (the limiter's, or the coordinator unreachable).
        RateLimitDeadlock, CheckpointError: the coordinator's refusal. BufferUnavailable: see the module docs.
    """
    if asked.admitted:
        return None
    ray = ray_module()
    failing_since: float | None = None
    pause = 0.01
    while True:
        left = asked.left()
        if asked.ref is None:  # the coordinator died under the last call: ask the restarted one
            if left is not None and left < 0:
                raise RateLimitTimeout(
                    f"remote buffer: {what} not admitted within timeout={asked.timeout}s: the coordinator did not "
                    "answer (restarting or gone); nothing was counted"
                )
            asked.ref = asked.ask(None if left is None else max(0.0, left))
        try:
            answer = ray.get(asked.ref, timeout=None if left is None else max(0.0, left) + GRACE_S)
        except ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):  # an answer that comes later counts nothing we wait for
                ray.cancel(asked.ref)
            asked.ref = None
            raise RateLimitTimeout(
                f"remote buffer: {what} not admitted within timeout={asked.timeout}s (the coordinator did not "
                "answer in time)"
            ) from None
        except ray.exceptions.RayActorError as exc:
            asked.ref = None
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if left is None and now - failing_since >= retry_timeout_s:
                raise BufferUnavailable(
                    f"remote buffer: {what}: the coordinator did not answer for {retry_timeout_s:g}s "
                    f"(retry_timeout_s): {str(exc).splitlines()[0]}"
                ) from None
            time.sleep(pause if left is None else max(0.0, min(pause, left)))
            pause = min(2 * pause, 0.5)
            continue
        except ray.exceptions.RayTaskError as exc:
            asked.ref = None
            if isinstance(exc.cause, ReplayBufferError):
                raise exc.cause from None
            raise
        asked.ref = None
        if isinstance(answer, ReplayBufferError):  # a refusal handed back as a value (see Coordinator)
            raise answer
        asked.admitted = True
        return answer if isinstance(answer, str) else None
