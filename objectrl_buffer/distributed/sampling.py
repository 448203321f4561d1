"""The read side of a remote buffer's handle (the base of :class:`~.remote.RemoteBuffer`; its attributes are set
by ``RemoteBuffer.__init__``).

* :meth:`Sampling.sample_batch` is one round trip (:mod:`.draws`): each shard draws the rows of its likely
  share of the batch plus a margin by its own rule and reports its mass (rows; prioritized: ``sum (p + eps) **
  alpha``); the handle splits the batch by a multinomial draw proportional to the masses and keeps that many of
  each shard's rows (a shard short of its share, ~0.1% of draws, is asked for the rest): every row has the
  probability it would have in one big buffer, and ~1.2x the kept rows cross the wire (not ``S`` times).
  Importance weights are recomputed over the whole batch. ``"index"`` is global (``shard * capacity + slot``);
  ``"generation"`` says which write of that slot was drawn.
* :meth:`Sampling.update_priority` ignores updates to slots rewritten since they were sampled (given the
  batch's ``"generation"``) and returns how many it applied.
* :meth:`Sampling.prefetch` keeps ``depth`` samples in flight as Ray refs (no helper thread): the learner
  finds the next batch ready while it trains on this one.

A sample is three steps, so that :meth:`Sampling.prefetch` keeps several in flight without a thread:
:meth:`Sampling.submit_sample` asks the limiter (and without one sends the shards' draws at once),
:meth:`Sampling.advance` sends the draws once the admission has come, :meth:`Sampling.finish_sample` collects
them (leaving out a shard that does not answer, in degraded mode: see :mod:`.health`) and combines them
(:mod:`.draws`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.distributed.admission import Asked, admit
from objectrl_buffer.distributed.calls import ShardCalls
from objectrl_buffer.distributed.draws import Draw, Sampler, get_all
from objectrl_buffer.distributed.health import DEGRADED_KEY
from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.distributed.wire import unpack
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, ReplayBufferError

__all__ = ["Sampling"]


class Sampling(ShardCalls):
    """Samples of a remote buffer (see the module docs).

    Attributes:
        capacity: rows per shard (a global ``"index"`` is ``shard * capacity + slot``). limited: a rate limiter
        admits samples (asked of the coordinator). sampler: how draws are split over the shards and what they
        shipped (see :mod:`.draws`).
    """

    capacity: int
    limited: bool
    sampler: Sampler

    def submit_sample(self, batch_size: int, timeout: float | None = None) -> Draw:
        """Start one :meth:`sample_batch` (see :meth:`finish_sample`): its admission is asked, and the live
        shards' draws are sent at once without a limiter, else once it is admitted (:meth:`advance`, or at the
        finish)."""
        self.check_cuts()
        live = self.health.live(self.shards)
        draw = Draw(batch_size, self.sampler.asks(batch_size, live), live)
        if self.limited:
            coordinator = self.coordinator
            draw.asked = Asked(lambda left: coordinator.admit_sample.remote(batch_size, left), timeout)
        else:
            draw.refs = self._draws(draw)
        return draw

    def _draws(self, draw: Draw, counted: int = 0) -> list[Any]:
        """The draws of ``draw``'s shards, ``draw.asks[j]`` rows of its ``j``-th (see :mod:`.draws`); ``counted``:
        the batch size of an admitted sample's first draw (the first shard asked counts it, see
        :meth:`.shard.Shard.sample`)."""
        count = counted if self.limited else 0
        return [
            self.shards[i].sample.remote(draw.asks[j], None, count if j == 0 else 0) for j, i in enumerate(draw.shards)
        ]

    def _top_up(self, short: list[tuple[int, int]]) -> list[bytes]:
        """``n`` more rows of each ``(shard, n)`` in ``short``, in one round trip (a shard's share of a batch
        exceeded the rows it was asked for, see :mod:`.draws`)."""
        return list(self.retry("sample_batch", lambda: [self.shards[i].sample.remote(n) for i, n in short]))

    def advance(self, draw: Draw) -> None:
        """Send ``draw``'s shard draws if its admission has come (never waits; a refusal is kept for the finish)."""
        if draw.refs is not None or draw.error is not None or draw.asked is None or not draw.asked.ready():
            return
        try:
            admit(draw.asked, f"sample of {draw.batch_size} rows", self.retry_timeout_s)
        except ReplayBufferError as exc:
            draw.error = exc
            return
        draw.refs = self._draws(draw, counted=draw.batch_size)

    def finish_sample(self, batch_size: int, draw: Draw, timeout: float | None = None) -> TensorDict:
        """The batch of :meth:`submit_sample`'s ``draw``: waits for its admission first (the shards draw only
        admitted samples, also while the coordinator is down: see :mod:`.admission`). In degraded mode a shard
        that does not answer within ``shard_timeout_s`` (or died) is left out and the batch flagged (see
        :mod:`.health`); else the draw waits for it, drawn again after its restart. Drawn again too if the
        limiter admitted it before any admitted row had landed (see :meth:`draw_admitted`).

        Raises:
            RateLimitTimeout, RateLimitDeadlock: not admitted. BufferUnavailable: see :meth:`retry`.
        """
        if draw.error is not None:
            raise draw.error
        if draw.refs is None:
            assert draw.asked is not None
            admit(draw.asked, f"sample of {batch_size} rows", self.retry_timeout_s)
            draw.refs = self._draws(draw, counted=batch_size)
        refs, draw.refs = draw.refs, []
        got, shards = self._collect(draw, refs)
        del refs
        try:
            return self._flagged(self.sampler.combine(batch_size, got, self._top_up, shards), shards)
        except EmptyBufferError:
            if not self.limited:
                raise
        return self.draw_admitted(batch_size, timeout)

    def _collect(self, draw: Draw, refs: list[Any]) -> tuple[list[Any], list[int]]:
        """The packed draws of ``draw`` and the shards they came from: in degraded mode those that answered
        within ``shard_timeout_s`` (the others marked down), else, or when none of those holds a row, all of
        them (a shard that died drawn again after its restart)."""
        ray = _ray()
        health = self.health
        if health.degrading and len(self.shards) > 1:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=health.shard_timeout_s)
            answered = {ref.hex() for ref in ready}
            got, shards = [], []
            for shard, ref in zip(draw.shards, refs, strict=True):
                if ref.hex() not in answered:
                    health.mark_down(shard, f"no draw within shard_timeout_s={health.shard_timeout_s:g}")
                    continue
                try:
                    got.append(ray.get(ref))
                except ray.exceptions.RayActorError as exc:
                    health.mark_down(shard, type(exc).__name__)
                    continue
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, ReplayBufferError):
                        raise exc.cause from None
                    raise
                shards.append(shard)
            if any(unpack(packed, copy=False)[0] > 0 for packed in got):
                return got, shards
            # no row among the shards that answered: waiting for the others beats a false EmptyBufferError
        try:
            return get_all(refs), list(draw.shards)
        except ray.exceptions.RayActorError:  # admitted already: drawn again, from every shard
            again = Draw(draw.batch_size, self.sampler.asks(draw.batch_size), list(range(len(self.shards))))
            return self.retry("sample_batch", lambda: self._draws(again)), again.shards
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ReplayBufferError):
                raise exc.cause from None
            raise

    def _flagged(self, batch: TensorDict, shards: list[int]) -> TensorDict:
        """``batch`` with its :data:`.health.DEGRADED_KEY` column (counted when ``True``)."""
        degraded = len(shards) < len(self.shards)
        if degraded:
            self.health.degraded_samples += 1
        batch.set(DEGRADED_KEY, torch.full(batch.batch_size, degraded, dtype=torch.bool))
        return batch

    def draw_admitted(self, batch_size: int, timeout: float | None) -> TensorDict:
        """Draw again until rows the limiter admitted have landed on a shard.

        The coordinator counts a write when it admits it, before its rows reach a shard, so a sample admitted
        on those counts can find every shard still empty. It is drawn again (back-off 1 ms to 50 ms) until a row
        has landed, for at most ``timeout`` seconds (``retry_timeout_s`` without one), then
        :class:`~objectrl_buffer.errors.EmptyBufferError`.
        """
        deadline = time.monotonic() + (self.retry_timeout_s if timeout is None else timeout)
        pause = 0.001
        while True:
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            live = self.health.live(self.shards)
            draw = Draw(batch_size, self.sampler.asks(batch_size, live), live)
            got, shards = self._collect(draw, self._draws(draw))
            try:
                return self._flagged(self.sampler.combine(batch_size, got, self._top_up, shards), shards)
            except EmptyBufferError:
                if time.monotonic() >= deadline:
                    raise

    def sample_batch(self, batch_size: int, *, timeout: float | None = None) -> TensorDict:
        """``batch_size`` rows over all shards with one big buffer's probabilities (see the module docs).

        Raises:
            EmptyBufferError: no shard holds a row. RateLimitTimeout, RateLimitDeadlock: not admitted.
            BufferUnavailable: see :meth:`retry`.
        """
        k = positive_int(batch_size, "batch_size")
        return self.finish_sample(k, self.submit_sample(k, timeout), timeout)

    def prefetch(self, batch_size: int, depth: int = 2, *, timeout: float | None = None) -> Iterator[TensorDict]:
        """An endless iterator of samples with ``depth`` of them in flight (Ray refs, dropped when taken)."""
        k, depth = positive_int(batch_size, "batch_size"), positive_int(depth, "depth")
        queue = deque(self.submit_sample(k, timeout) for _ in range(depth))
        try:
            while True:
                draw = queue.popleft()
                queue.append(self.submit_sample(k, timeout))
                batch = self.finish_sample(k, draw, timeout)
                del draw
                for later in queue:  # admitted meanwhile: their draws go now, ready by the next batch
                    self.advance(later)
                yield batch
        finally:
            queue.clear()

    def update_priority(self, index: Any, priority: Any, generation: Any = None) -> int:
        """Set priorities at global ``index`` (a sample's ``"index"``); with the sample's ``"generation"``,
        slots rewritten since are skipped, and in degraded mode those of a shard down (see :mod:`.health`).
        Returns how many were applied."""
        slots = torch.as_tensor(index).reshape(-1).numpy().astype(np.int64)
        values = torch.as_tensor(priority, dtype=torch.float64).reshape(-1).numpy()
        gens = None if generation is None else torch.as_tensor(generation).reshape(-1).numpy().astype(np.int64)
        if len(values) != len(slots) or (gens is not None and len(gens) != len(slots)):
            raise InvalidArgumentError("update_priority: index, priority and generation must have one value per row")
        shard_of = slots // self.capacity
        parts = []
        live = self.health.live(self.shards)
        for i in np.unique(shard_of).tolist():
            if not 0 <= i < len(self.shards):
                raise InvalidArgumentError(f"update_priority: index {int(slots[shard_of == i][0])} names no shard")
            if i not in live:  # degraded: a down shard's updates are dropped (not counted as applied)
                continue
            mask = shard_of == i
            parts.append((i, slots[mask] % self.capacity, values[mask], None if gens is None else gens[mask]))
        return int(
            sum(
                self.retry("update_priority", lambda: [self.shards[p[0]].update_priority.remote(*p[1:]) for p in parts])
            )
        )
