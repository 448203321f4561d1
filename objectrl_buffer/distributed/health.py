"""Which shards of a :class:`~.remote.RemoteBuffer` answer, as one handle sees them: its degraded mode.

Ray learns that a node died from its health checks (about 15-20 s with the defaults, see docs/ray.md "Losing
a node"), then restarts the node's actors elsewhere. Until then a call to a shard of that node neither
returns nor fails. With ``shard_loss="wait"`` every call waits for such a shard, as one big buffer would;
with ``shard_loss="degrade"`` (the default) a handle goes on without it:

* **Down.** A shard is *down* for this handle when one of its draws has not answered within
  ``shard_timeout_s``, or a call to it failed because its actor died. A warning is logged once an outage
  (naming the shard, why and when), and one line when it is back.
* **Samples** come from the live shards only, with the probabilities of one buffer made of them (a down shard's
  rows cannot be drawn). Every batch of a RemoteBuffer has a bool column :data:`DEGRADED_KEY` of shape
  ``[batch]``: ``True`` in a batch drawn while a shard was left out. :attr:`ShardHealth.degraded_samples`
  counts them. When every shard is down, a sample waits as in ``"wait"`` mode.
* **New writes** (``add``, ``add_batch``, a :class:`~.writer.Writer`'s batches) go to the live shards in turn.
  A write *already sent* to a shard that then died is never sent elsewhere: the shard may have stored it
  before dying, and another shard would store it a second time. A blocking ``add``/``add_batch`` waits for
  that shard's restart and is sent to it again (stored once, by its ``(stream, seq)``; see :mod:`.remote`), so
  its caller stalls for Ray's detection and the restart; a :class:`~.writer.Writer` sets such batches aside
  (counted in its ``undelivered``) and sends them again once the shard is back, so it goes on meanwhile.
  :attr:`ShardHealth.rerouted_writes` counts writes routed around a down shard.
* **Back.** While a shard is down, the handle keeps one cheap call to it on its way (its ``counts``) and looks
  at it without waiting; when it answers, the shard is live again.

The limiter is not part of this: a sample or a write that the limiter must admit still waits for the
coordinator (or raises after its ``timeout``) while the coordinator is down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from objectrl_buffer.distributed.ray_import import ray_module as _ray

__all__ = ["DEGRADED_KEY", "SHARD_LOSS", "HealthSnapshot", "ShardHealth"]

logger = logging.getLogger(__name__)

#: The bool column ``[batch]`` of every RemoteBuffer sample: drawn while a shard was left out.
DEGRADED_KEY = "degraded"

#: The values of ``RemoteBuffer.launch(shard_loss=...)``.
SHARD_LOSS: tuple[str, ...] = ("degrade", "wait")


class HealthSnapshot(TypedDict):
    """What :meth:`ShardHealth.snapshot` returns."""

    mode: str
    down: list[int]
    outages: int
    degraded_samples: int
    rerouted_writes: int


class ShardHealth:
    """The shards one handle finds down (see the module docs). Thread-safe.

    Args:
        num_shards: shards of the buffer. mode: ``"degrade"`` or ``"wait"``. shard_timeout_s: how long a draw
            may take before its shard is left out of a degraded sample.
    """

    def __init__(
        self, num_shards: int, mode: Literal["degrade", "wait"] = "degrade", shard_timeout_s: float = 2.0
    ) -> None:
        self.num_shards, self.mode, self.shard_timeout_s = num_shards, mode, shard_timeout_s
        self.down: dict[int, float] = {}  # shard -> time.monotonic() it was found down
        self.probes: dict[int, Any] = {}  # shard -> a counts() ref on its way
        self.outages = 0
        self.degraded_samples = 0
        self.rerouted_writes = 0
        self._lock = threading.Lock()

    @property
    def degrading(self) -> bool:
        """Whether this handle goes on without down shards (``shard_loss="degrade"``)."""
        return self.mode == "degrade"

    def mark_down(self, shard: int, why: str) -> None:
        """``shard`` is down from now (logged once an outage)."""
        with self._lock:
            if shard in self.down:
                return
            self.down[shard] = time.monotonic()
            self.outages += 1
        logger.warning(
            "remote buffer: shard %d is down (%s) at %s; samples and new writes go to the other shards until it "
            "answers again",
            shard,
            why,
            time.strftime("%H:%M:%S"),
        )

    def live(self, shards: Sequence[Any]) -> list[int]:
        """The numbers of the shards not down (all in ``"wait"`` mode, and when every shard is down); looks at
        the probes of down shards first (never waits)."""
        if not self.degrading:
            return list(range(self.num_shards))
        if self.down:
            self._look(shards)
        live = [i for i in range(self.num_shards) if i not in self.down]
        return live or list(range(self.num_shards))

    def _look(self, shards: Sequence[Any]) -> None:
        ray = _ray()
        for shard in list(self.down):
            probe = self.probes.get(shard)
            if probe is None:
                self.probes[shard] = shards[shard].counts.remote()
                continue
            if not ray.wait([probe], timeout=0)[0]:
                continue
            del self.probes[shard]
            try:
                ray.get(probe)
            except ray.exceptions.RayError:  # died meanwhile, or restarting: asked again next time
                continue
            with self._lock:
                since = self.down.pop(shard, None)
            if since is not None:
                logger.warning("remote buffer: shard %d is back after %.1f s", shard, time.monotonic() - since)

    def snapshot(self) -> HealthSnapshot:
        """The mode, the shards down now, and the counters (outages, degraded samples, rerouted writes)."""
        return {
            "mode": self.mode,
            "down": sorted(self.down),
            "outages": self.outages,
            "degraded_samples": self.degraded_samples,
            "rerouted_writes": self.rerouted_writes,
        }
