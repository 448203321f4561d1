"""What a :class:`~.remote.RemoteBuffer` reports about itself: :meth:`RemoteBuffer.stats
<.remote.RemoteBuffer.stats>` (a dict per shard and for the whole buffer) and the same numbers as Ray metrics.

Ray metrics (``ray.util.metrics``; Ray's metrics agent exports them for Prometheus, and the Ray dashboard
shows them) are gauges tagged ``buffer`` (the buffer's id, or its name when it has one) and, for a shard's,
``shard``. The shards and the coordinator set them from a thread of their own once a second (nothing on the
write or sample path):

- ``objectrl_buffer_shard_rows``: rows the shard holds;
- ``objectrl_buffer_shard_inserts``: rows it ever wrote (a restart reloads its cut's count);
- ``objectrl_buffer_shard_sampled_rows``: rows its draws shipped;
- ``objectrl_buffer_shard_lost_rows``: rows its restarts dropped (see ``lost_rows``);
- ``objectrl_buffer_limiter_inserts``, ``objectrl_buffer_limiter_samples``: the limiter's counters (the
  coordinator);
- ``objectrl_buffer_limiter_insert_blocked_seconds``, ``objectrl_buffer_limiter_sample_blocked_seconds``:
  seconds writes and samples waited for the limiter, in all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypedDict

__all__ = ["Rates", "BufferStats", "LimiterStats", "MetricsThread", "ShardStats"]


class ShardStats(TypedDict):
    """One shard's numbers (see :meth:`.shard.Shard.usage`)."""

    shard: int
    node_id: str
    rows: int
    inserts: int
    sampled_rows: int
    lost_rows: int
    restarted: bool


class LimiterStats(TypedDict):
    """The coordinator's limiter: its counters and how long admissions waited (seconds, in all)."""

    inserts: int
    samples: int
    deletes: int
    insert_blocked_s: float
    sample_blocked_s: float


class BufferStats(TypedDict):
    """What :meth:`RemoteBuffer.stats <.remote.RemoteBuffer.stats>` returns.

    ``inserts_per_s`` and ``samples_per_s`` are rates over the time since this handle's previous ``stats()``
    call (its first: since the handle was made): rows the shards wrote, and rows this handle's samples kept.
    ``pending_rows``: rows the limiter admitted that no shard holds or counts as lost yet (on their way);
    ``None`` without a limiter. ``last_cut_age_s``: seconds since the last good checkpoint cut (``None``: none).
    """

    shards: list[ShardStats]
    rows: int
    inserts: int
    inserts_per_s: float
    samples: int
    samples_per_s: float
    lost_rows: int
    restarted_shards: int
    pending_rows: int | None
    limiter: LimiterStats | None
    last_cut_age_s: float | None
    traffic: dict[str, int]
    health: dict[str, object]


class Rates:
    """Builds :class:`BufferStats` from the actors' numbers; its rates are over the time since its last call."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), 0, 0)  # (when, inserts, samples) at the last call

    def stats(
        self,
        shards: list[ShardStats],
        limiter: LimiterStats | None,
        last_cut_age_s: float | None,
        traffic: dict[str, int],
        health: dict[str, object],
    ) -> BufferStats:
        """The buffer's numbers from each shard's ``usage()``, the coordinator's (``None``: none) and the handle's."""
        inserts = sum(s["inserts"] for s in shards)
        samples = sum(s["sampled_rows"] for s in shards)
        lost = sum(s["lost_rows"] for s in shards)
        now = time.monotonic()
        since, last_inserts, last_samples = self._last
        elapsed = max(now - since, 1e-9)
        self._last = (now, inserts, samples)
        return {
            "shards": shards,
            "rows": sum(s["rows"] for s in shards),
            "inserts": inserts,
            "inserts_per_s": max(0, inserts - last_inserts) / elapsed,
            "samples": samples,
            "samples_per_s": max(0, samples - last_samples) / elapsed,
            "lost_rows": lost,
            "restarted_shards": sum(1 for s in shards if s["restarted"]),
            "pending_rows": None if limiter is None else max(0, limiter["inserts"] - inserts - lost),
            "limiter": limiter,
            "last_cut_age_s": last_cut_age_s,
            "traffic": traffic,
            "health": health,
        }


class MetricsThread:
    """Sets Ray gauges from ``read()`` (``{gauge name: value}``) once every ``every_s`` seconds, in a daemon
    thread; ``last`` is what was set last (also where a test reads them)."""

    def __init__(
        self, read: Callable[[], dict[str, float]], tags: dict[str, str], every_s: float = 1.0, start: bool = True
    ) -> None:
        from ray.util.metrics import Gauge

        self.read, self.tags, self.every_s = read, tags, every_s
        self.gauges = {name: Gauge(name, tag_keys=tuple(tags)) for name in read()}
        self.last: dict[str, float] = {}
        self.update()
        if start:
            threading.Thread(target=self._loop, daemon=True).start()

    def update(self) -> None:
        values = self.read()
        for name, value in values.items():
            self.gauges[name].set(float(value), tags=self.tags)
        self.last = values

    def _loop(self) -> None:
        while True:
            time.sleep(self.every_s)
            try:
                self.update()
            except Exception:  # never kill the actor for its metrics: tried again next time
                continue
