"""What every call of a remote buffer's handle goes through: retries across a shard's restart and the look at the
checkpoint cuts (the base of :class:`~.remote.RemoteBuffer`; its attributes are set by ``RemoteBuffer.__init__``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from objectrl_buffer.distributed.cut_watch import CutWatch
from objectrl_buffer.distributed.health import ShardHealth
from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.errors import BufferUnavailable, ReplayBufferError

__all__ = ["ShardCalls"]


class ShardCalls:
    """Calls to a remote buffer's actors that survive their restarts (see :meth:`retry`).

    Attributes:
        shards: the shard actors. coordinator: the coordinator actor (``None``: none). health: the shards this
        handle finds down (see :mod:`.health`). retry_timeout_s: how long :meth:`retry` retries. cuts: the
        checkpoint cuts seen (``None`` without a coordinator, see :mod:`.cut_watch`).
    """

    shards: list[Any]
    coordinator: Any
    health: ShardHealth
    retry_timeout_s: float
    cuts: CutWatch | None

    def retry(self, what: str, submit: Callable[[], Any], shard: int | None = None) -> Any:
        """``ray.get(submit())``, submitted again while the actor is dead or restarting, for up to
        ``retry_timeout_s``; errors of ours raised in the actor come out as themselves. ``shard``: the shard
        called, marked down for this handle's other calls while it fails (see :mod:`.health`).

        Raises:
            BufferUnavailable: still failing when the time is up (``what`` names the call).
        """
        ray = _ray()
        deadline = time.monotonic() + self.retry_timeout_s
        wait = 0.01
        while True:
            try:
                return ray.get(submit())
            except ray.exceptions.RayActorError as exc:
                if shard is not None:
                    self.health.mark_down(shard, f"{what}: {type(exc).__name__}")
                if time.monotonic() >= deadline:
                    raise BufferUnavailable(
                        f"remote buffer: {what} failed for {self.retry_timeout_s:g}s (retry_timeout_s): {exc}"
                    ) from None
                time.sleep(wait)
                wait = min(2 * wait, 0.5)
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, ReplayBufferError):
                    raise exc.cause from None
                raise

    def check_cuts(self) -> None:
        """What each write and sample calls first: see :meth:`.cut_watch.CutWatch.check` (nothing without a
        coordinator).

        Raises:
            CheckpointError: ``max_failed_cuts`` cuts failed in a row.
        """
        if self.cuts is not None:
            self.cuts.check()
