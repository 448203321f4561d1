"""The one place a remote buffer's shards share: its rate limiter and its checkpoint cuts (a Ray actor).

The contract (in the manner of Reverb's rate-limiter and checkpoint docs):

* **What it owns.** The limiter's counters (``inserts``, ``samples``, ``deletes``), the rows it believes each
  shard holds (to count evictions), the checkpoint cuts (the generation, the manifest, the pruning) and their
  health (failed cuts, the last good cut's time). It owns no rows: the shards hold the data and are its
  source of truth.
* **What a restart restores** (Ray restarts this actor after its process or node died; also
  ``launch(resume=True)``): the counters are *rebuilt from the shards' own counts*
  (:meth:`.shard.Shard.counts`): ``inserts`` = rows the shards ever wrote, ``deletes`` = those no longer held,
  ``samples`` = admitted samples the shards were told to count (each admitted draw tells one shard). So after
  any restart the limiter agrees with what the shards hold, not with the last cut: the shards keep the rows
  written since it, and rolling them back to the cut instead would drop acknowledged rows to make the counts
  agree. The cut's generation, its kept generations and its time come from the manifest. Not restored: the
  failure counts of cuts (they start again at 0) and the admissions that were waiting (each handle asks the
  restarted actor again, see :mod:`.admission`). A write admitted by the dead actor and still on its way to
  its shard when the restarted one read the shards' counts is counted when it lands (its admission's
  *ticket* says which incarnation admitted it, see :mod:`.tickets`). A shard's own restart drops the rows
  written since its cut from both its rows and its ``written`` (they are counted in ``lost_rows``), so the
  limiter rebuilt after that agrees with the shard as it is.

* Rate limiting: the handle asks :meth:`Coordinator.admit_insert` / :meth:`Coordinator.admit_sample`, waits
  for the answer and only then sends the shard call (:mod:`.admission`). The limiter is the user's
  :class:`~objectrl_buffer.flow.RateLimiter` (Reverb's rules; a batch is admitted all at once or not at all);
  evictions are counted per shard (a shard holds at most its capacity). The coordinator is an *async* actor:
  a blocked admission is a coroutine waiting on the limiter (:meth:`RateLimiter.insert_async`), not a thread,
  so any number of waiting writers leave it free to answer a learner's sample (and its ``timeout``) at once.
  Over Ray the limiter cannot tell who may still call it, so its thread-based deadlock rule is off and a
  wait ends by admission or by its ``timeout``; a call larger than the limiter's window is refused at once
  (:class:`~objectrl_buffer.errors.RateLimitDeadlock`). Refusals are *returned*, not raised (a prefetch's
  admission that nobody fetches would otherwise be logged by Ray as an unhandled error).
* Checkpoints (:meth:`Coordinator.checkpoint`, also every ``checkpoint_every_s`` seconds): the limiter's
  counters are read, every shard saves (in parallel), the manifest naming the generation is written atomically
  (the commit point), the shards drop their journals up to it, and generations beyond the last ``keep_last``
  are removed. Admissions go on meanwhile: nothing is restored from the manifest's counters (a restart
  rebuilds them from the shards, see above; they are kept as a record), so a cut need not stop the writers,
  and a shard that dies in the middle of one holds up only that cut (until Ray declares it dead), never the
  other shards' writes and samples. Each shard saves what it holds when its save runs: a write stored after
  that is in the next cut, and if that shard dies first, its writer's retry stores it again (counted once).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
from typing import Any

from objectrl_buffer.distributed.cut import generation_name, prune, read_manifest, write_manifest
from objectrl_buffer.distributed.location import Location, as_location, probe
from objectrl_buffer.distributed.observe import LimiterStats, MetricsThread
from objectrl_buffer.distributed.tickets import LateTally, new_ticket
from objectrl_buffer.errors import CheckpointError, RateLimitDeadlock, RateLimitTimeout, ReplayBufferError
from objectrl_buffer.flow.limiter import RateLimiter

__all__ = ["LATE_EVERY_S", "PING_S", "Coordinator"]

#: Seconds every shard has to answer before a checkpoint cut starts (else the cut is skipped); also how long a
#: count of late rows waits for a shard (see :meth:`Coordinator.count_late`).
PING_S = 2.0
#: How often a restarted coordinator counts the late rows of its predecessor's admissions (seconds).
LATE_EVERY_S = 1.0

logger = logging.getLogger(__name__)


def _age(when: float | None) -> str:
    return "none yet" if when is None else f"{max(0.0, time.time() - when):.1f} s ago"


class Coordinator:
    """Limiter and checkpoint cuts of ``shards`` (Ray actor handles of :class:`~.shard.Shard`).

    Args:
        limiter: the rate limiter (``None``: none; admissions return at once).
        capacity: rows one shard holds (evictions beyond it count as the limiter's deletes).
        root, every_s, keep_last: ``checkpoint_path``, ``checkpoint_every_s`` and how many generations to keep.
        resume: start from the manifest's generation and the shards' counts (a restart of this actor always
            does, see the module docs).
        max_failed_cuts: cuts failing in a row before every admission is refused with ``CheckpointError``.
        metrics_tag: the buffer's tag of the limiter's Ray gauges (``None``: no gauges; see :mod:`.observe`).
    """

    def __init__(
        self,
        shards: list[Any],
        limiter: RateLimiter | None,
        capacity: int,
        root: Location | str | None = None,
        every_s: float | None = None,
        keep_last: int = 2,
        resume: bool = False,
        max_failed_cuts: int = 3,
        metrics_tag: str | None = None,
    ) -> None:
        import ray

        self.shards, self.capacity, self.keep_last = shards, capacity, keep_last
        self.root = None if root is None else as_location(root)
        self.limiter = copy.copy(limiter)
        if self.limiter is not None:
            self.limiter.deadlock_after_s = None  # see the module docs
        self.rows = [0] * len(shards)
        self.generation = 0
        self.kept: list[int] = []
        self.cutting = asyncio.Lock()  # one cut at a time
        self.max_failed_cuts = max_failed_cuts
        self.failed_cuts = 0  # cuts that failed, ever (this actor's lifetime)
        self.failing = 0  # failed in a row since the last good one
        self.skipped_cuts = 0  # cuts skipped because a shard did not answer (see checkpoint())
        self.blocked = {"insert": 0.0, "sample": 0.0}  # seconds admissions waited for the limiter, in all
        self.last_good: float | None = None  # wall time of the last good cut (the manifest's, after a restart)
        self.last_error: str | None = None
        self.ticket = new_ticket()  # this incarnation's: what its admissions answer (see .tickets)
        self.late = LateTally(len(shards))
        if self.root is not None:
            self.root.makedirs()
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if self.root is not None:
            manifest = read_manifest(self.root)
            if manifest is not None and (resume or restarted):
                self._adopt(manifest)
        self.rebuilt = resume or restarted  # only a rebuilt limiter has late rows to count (see .tickets)
        if self.rebuilt:
            self._rebuild()
            if self.limiter is not None:  # writes its predecessor admitted may still land
                threading.Thread(target=self._every, args=(LATE_EVERY_S, "count_late"), daemon=True).start()
        if root is not None and every_s is not None:
            threading.Thread(target=self._every, args=(every_s, "checkpoint"), daemon=True).start()
        #: Ray gauges of the limiter (see :mod:`.observe`), when ``metrics_tag`` (the buffer's) is given
        self.metrics = None if metrics_tag is None else MetricsThread(self._metric_values, {"buffer": metrics_tag})

    def _adopt(self, manifest: dict[str, Any]) -> None:
        self.generation = manifest["generation"]
        self.last_good = manifest.get("time")
        self.kept = list(manifest.get("kept", [self.generation]))

    def _rebuild(self) -> None:
        """The limiter's counters and the rows per shard from what the shards hold now (see the module docs)."""
        import ray

        counts = ray.get([shard.counts.remote(self.ticket) for shard in self.shards])
        self.rows = [held for _, held, _ in counts]
        if self.limiter is not None:
            values = {
                "inserts": sum(written for written, _, _ in counts),
                "samples": sum(sampled for _, _, sampled in counts),
                "deletes": sum(max(0, written - held) for written, held, _ in counts),
            }
            self.limiter.check({}, values, sum(self.rows), "the shards' counts")
            self.limiter.restore({}, values)

    def _every(self, every_s: float, method: str) -> None:
        """The automatic cuts (``"checkpoint"``) and counts of late rows (``"count_late"``): a thread of this
        actor that calls its own ``method`` through Ray (it runs on the actor's event loop, as every other call)."""
        import ray

        me = ray.get_runtime_context().current_actor
        while True:
            time.sleep(every_s)
            with contextlib.suppress(Exception):  # a failed cut is counted and logged by checkpoint()
                ray.get(getattr(me, method).remote())

    async def count_late(self) -> int:
        """Count as inserted (and what they evicted) the rows of this actor's predecessors' admissions that
        landed after its rebuild and are not counted yet (see :mod:`.tickets`); how many. A shard that does not
        answer within :data:`PING_S` is counted at the next call."""
        if self.limiter is None or not self.rebuilt:
            return 0
        asks = [shard.late_rows.remote(self.ticket) for shard in self.shards]
        calls = [asyncio.ensure_future(asyncio.wait_for(ask, PING_S)) for ask in asks]
        reports = await asyncio.gather(*calls, return_exceptions=True)
        counted = 0
        for shard, report in enumerate(reports):  # no await below: concurrent calls never count a row twice
            if isinstance(report, BaseException):
                continue
            n = self.late.take(shard, report)
            if n:
                self.limiter.record_inserts(n)
                self._held(shard, n)
                counted += n
        return counted

    def _held(self, shard: int, n: int) -> None:
        """``n`` more rows on ``shard``: the rows it evicts past its capacity count as the limiter's deletes."""
        assert self.limiter is not None
        held = self.rows[shard] + n
        self.rows[shard] = min(held, self.capacity)
        if held > self.capacity:
            self.limiter.delete(held - self.capacity)

    def _refuse_if_failing(self) -> CheckpointError | None:
        """The error every admission answers once ``max_failed_cuts`` cuts failed in a row (else ``None``)."""
        if self.failing < self.max_failed_cuts:
            return None
        return CheckpointError(
            f"remote buffer: the last {self.failing} checkpoint cuts failed ({self.last_error}); last good cut: "
            f"{_age(self.last_good)}. Writes and samples are refused until a cut succeeds (handle.checkpoint())"
        )

    async def probe(
        self, write: tuple[str, str] | None, read: dict[str, str], cleanup: tuple[str, ...] = ()
    ) -> tuple[str, list[str]]:
        """One step of the launch check at the checkpoint location (:func:`.location.probe`): this actor's
        node and what went wrong."""
        import ray

        node = str(ray.get_runtime_context().get_node_id())
        return node, ["has no checkpoint location"] if self.root is None else probe(self.root, write, read, cleanup)

    async def cut_status(self) -> dict[str, Any]:
        """``failed_cuts`` (ever, this actor), ``failing`` (in a row), ``last_cut_age_s`` (seconds since the last
        good cut, ``None``: none yet), ``last_error`` (of the last failed or skipped cut), ``max_failed_cuts`` and
        ``skipped_cuts`` (skipped because a shard did not answer, see :meth:`checkpoint`)."""
        age = None if self.last_good is None else max(0.0, time.time() - self.last_good)
        return {
            "failed_cuts": self.failed_cuts,
            "failing": self.failing,
            "last_cut_age_s": age,
            "last_error": self.last_error,
            "max_failed_cuts": self.max_failed_cuts,
            "skipped_cuts": self.skipped_cuts,
        }

    async def node_id(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    # ------------------------------------------------------------------ rate limiting
    async def admit_insert(self, shard: int, n: int, timeout: float | None) -> str | ReplayBufferError:
        """Wait until ``n`` rows bound for ``shard`` are admitted, then count them (and what they evict); this
        incarnation's ticket (the write carries it to the shard, see :mod:`.tickets`), or the refusal
        (:class:`~objectrl_buffer.errors.RateLimitTimeout`, ``RateLimitDeadlock``, ``CheckpointError``: nothing
        counted), returned.
        """
        refused = self._refuse_if_failing()
        if refused is not None:
            return refused
        if self.limiter is not None and n > 0:
            start = time.monotonic()
            try:
                await self.limiter.insert_async(n, timeout)
            except (RateLimitTimeout, RateLimitDeadlock) as exc:
                return exc
            finally:
                self.blocked["insert"] += time.monotonic() - start
            self._held(shard, n)
        return self.ticket

    async def admit_sample(self, n: int, timeout: float | None) -> bool | ReplayBufferError:
        """Wait until ``n`` samples are admitted, then count them; ``True``, or the refusal, returned (see the
        module docs; nothing counted)."""
        refused = self._refuse_if_failing()
        if refused is not None:
            return refused
        if self.limiter is not None:
            start = time.monotonic()
            try:
                await self.limiter.sample_async(n, timeout)
            except (RateLimitTimeout, RateLimitDeadlock) as exc:
                return exc
            finally:
                self.blocked["sample"] += time.monotonic() - start
        return True

    async def usage(self) -> LimiterStats | None:
        """The limiter's counters and the seconds admissions waited for it (``None`` without a limiter)."""
        if self.limiter is None:
            return None
        counters = await self.counters()
        return {
            "inserts": counters["inserts"],
            "samples": counters["samples"],
            "deletes": counters["deletes"],
            "insert_blocked_s": self.blocked["insert"],
            "sample_blocked_s": self.blocked["sample"],
        }

    def _metric_values(self) -> dict[str, float]:
        values = self.limiter.state()[1] if self.limiter is not None else {}
        return {
            "objectrl_buffer_limiter_inserts": float(values.get("inserts", 0)),
            "objectrl_buffer_limiter_samples": float(values.get("samples", 0)),
            "objectrl_buffer_limiter_insert_blocked_seconds": self.blocked["insert"],
            "objectrl_buffer_limiter_sample_blocked_seconds": self.blocked["sample"],
        }

    async def metric_values(self) -> dict[str, float]:
        """What the coordinator's Ray gauges were set to last (see :mod:`.observe`; empty without metrics)."""
        return {} if self.metrics is None else dict(self.metrics.last)

    async def counters(self) -> dict[str, int]:
        """The limiter's ``inserts``, ``samples`` and ``deletes`` (empty without a limiter), late rows counted
        first (see :meth:`count_late`)."""
        if self.limiter is None:
            return {}
        await self.count_late()
        _, values = self.limiter.state()
        return {key: int(values[key]) for key in ("inserts", "samples", "deletes")}

    # ------------------------------------------------------------------ checkpoints
    async def checkpoint(self) -> int:
        """Take one cut of every shard and the limiter, under one manifest (see the module docs); its generation.

        A failed cut is counted (:meth:`cut_status`), logged as a warning, and raised. A cut is first asked of
        every shard without pausing admissions: a shard that does not answer within :data:`PING_S` (its node
        lost, its actor restarting) skips the cut, counted in ``skipped_cuts`` and raised as a
        :class:`~objectrl_buffer.errors.CheckpointError`, but not in the ``failing`` streak that refuses
        admissions: the other shards go on (degraded mode, see :mod:`.health`), and the next cut is tried
        ``checkpoint_every_s`` later. So does a shard lost during the cut (its actor died or became
        unreachable: Ray's ``RayActorError``): a lost node is Ray's to restart, not a storage failure."""
        import ray

        missing = await self._unreachable()
        if missing:
            self.skipped_cuts += 1
            self.last_error = f"shards {missing} did not answer within {PING_S:g} s: cut skipped"
            logger.warning("remote buffer: checkpoint cut skipped: %s", self.last_error)
            raise CheckpointError(f"remote buffer: {self.last_error}")
        try:
            generation = await self._cut()
        except ray.exceptions.RayActorError as exc:
            self.skipped_cuts += 1
            self.last_error = f"a shard was lost during the cut ({type(exc).__name__}): cut skipped"
            logger.warning("remote buffer: checkpoint cut skipped: %s: %s", self.last_error, exc)
            raise CheckpointError(f"remote buffer: {self.last_error}") from None
        except Exception as exc:
            self.failed_cuts += 1
            self.failing += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "remote buffer: checkpoint cut failed (%d in a row, %d in all; last good cut: %s): %s",
                self.failing,
                self.failed_cuts,
                _age(self.last_good),
                self.last_error,
            )
            raise
        self.failing, self.last_good, self.last_error = 0, time.time(), None
        return generation

    async def _unreachable(self) -> list[int]:
        """The shards that do not answer a ``counts`` call within :data:`PING_S`."""
        calls = [asyncio.ensure_future(asyncio.wait_for(shard.counts.remote(), PING_S)) for shard in self.shards]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        return [i for i, answer in enumerate(answers) if isinstance(answer, BaseException)]

    async def _cut(self) -> int:
        assert self.root is not None
        async with self.cutting:
            generation = await self._save()
        prune(self.root, set(self.kept))
        return generation

    async def _save(self) -> int:
        """The cut itself: every shard saves, then the manifest, then the shards' commits (admissions go on)."""
        assert self.root is not None
        generation = self.generation + 1
        self.root.makedirs(generation_name(generation))
        limiter = self.limiter.state()[1] if self.limiter is not None else {}
        rows = list(await asyncio.gather(*[shard.checkpoint.remote(generation) for shard in self.shards]))
        kept = [*self.kept, generation][-self.keep_last :]
        manifest = {"generation": generation, "rows": rows, "limiter": limiter, "kept": kept, "time": time.time()}
        write_manifest(self.root, manifest)
        self.generation, self.kept = generation, kept
        await asyncio.gather(*[shard.commit.remote(generation) for shard in self.shards])
        return generation
