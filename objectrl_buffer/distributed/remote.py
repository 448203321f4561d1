"""A buffer served by Ray actors (the ``ray`` extra): one actor per shard, a handle with the buffer's methods.

``RemoteBuffer.launch(buffer_cls, *args, num_shards=..., **kwargs)`` starts ``num_shards`` actors
(:class:`~.shard.Shard`), each holding ``buffer_cls(*args, **kwargs)``, and, when a rate limiter or
checkpoints are asked for, one :class:`~.coordinator.Coordinator` actor. Payloads travel as NumPy arrays
(Ray's zero-copy path; torch tensors are pickled copies, 10-40x slower); Ray carries the calls.

* Writes go to the shards in turn (``add``, ``add_batch``); :meth:`RemoteBuffer.writer` batches single adds
  client-side (:class:`~.writer.Writer`, in :mod:`.writer`) into preallocated columns, with at most
  ``max_in_flight`` batches on their way. Every write carries ``(stream id, seq)``: a write retried after a shard
  restart is stored exactly once, and so is each acknowledged write of threads sharing one handle (each call in
  flight has a stream of its own, see ``RemoteBuffer._take``) or one :class:`Writer` (its calls take turns on a
  lock). A writer on a shard's own node keeps its columns in files of its own in ``/dev/shm`` and sends that shard
  only a small :class:`~.wire.SharedRows` descriptor: the shard copies the rows straight from its mapping of the
  files (no serialization, no object store).
* Samples, prefetching and priority updates: see :mod:`.sampling` (the handle's base class).
* Faults: a call that meets a dead shard is retried (Ray restarts the actor from the last checkpoint) until
  ``retry_timeout_s``, then :class:`~objectrl_buffer.errors.BufferUnavailable`; :attr:`RemoteBuffer.lost_rows`
  says how many stored rows the restarts dropped. A handle pickles into Ray tasks and actors (each copy
  writes under its own writer id).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from objectrl_buffer.core.keys import GENERATION_KEY
from objectrl_buffer.core.validate import positive_int, real_in
from objectrl_buffer.distributed.admission import Asked, admit
from objectrl_buffer.distributed.coordinator import Coordinator
from objectrl_buffer.distributed.cut_watch import CutWatch
from objectrl_buffer.distributed.discovery import Registry, check_free, find, named_options
from objectrl_buffer.distributed.draws import Sampler
from objectrl_buffer.distributed.health import SHARD_LOSS, ShardHealth
from objectrl_buffer.distributed.location import Location
from objectrl_buffer.distributed.location import check as check_location
from objectrl_buffer.distributed.observe import BufferStats, LimiterStats, Rates, ShardStats
from objectrl_buffer.distributed.placement import coordinator_actor_options, place_shards
from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.distributed.sampling import Sampling
from objectrl_buffer.distributed.shard import Shard
from objectrl_buffer.distributed.wire import to_numpy
from objectrl_buffer.distributed.writer import Writer
from objectrl_buffer.errors import (
    InvalidArgumentError,
    ReplayBufferError,
)
from objectrl_buffer.flow.limited import batch_rows
from objectrl_buffer.flow.limiter import RateLimiter

__all__ = ["RemoteBuffer", "Shard", "Writer", "GENERATION_KEY", "to_numpy"]


class RemoteBuffer(Sampling):
    """A handle on shard actors (see the module docs). Build it with :meth:`launch`.

    Attributes:
        shards: the shard actors; capacity: rows per shard; writer_id: this handle's writer id.
    """

    def __init__(
        self,
        shards: list[Any],
        capacity: int,
        beta: float | None,
        seed: int | None = None,
        *,
        coordinator: Any = None,
        limited: bool = False,
        num_envs: int = 1,
        retry_timeout_s: float = 30.0,
        max_failed_cuts: int = 3,
        buffer_id: str = "",
        shard_loss: Literal["degrade", "wait"] = "degrade",
        shard_timeout_s: float = 2.0,
        name: str | None = None,
        namespace: str | None = None,
        placement_group: Any = None,
    ) -> None:
        self.shards, self.capacity, self.beta = shards, capacity, beta
        #: the buffer's name and namespace (``None``: unnamed; see :mod:`.discovery`)
        self.name, self.namespace = name, namespace
        self.registry: Any = None  # a named buffer's registry actor (see :mod:`.discovery`)
        #: the placement group the buffer made for its shards (``None``: none; see :mod:`.placement`)
        self.placement_group = placement_group
        self._rates = Rates()  # stats(): its rates are since the previous call
        #: the shards this handle finds down, and its degraded mode's counters (see :mod:`.health`)
        self.health = ShardHealth(len(shards), shard_loss, shard_timeout_s)
        self.buffer_id = buffer_id
        self.max_failed_cuts = max_failed_cuts
        self.coordinator, self.limited, self.num_envs = coordinator, limited, num_envs
        self.cuts = None if coordinator is None else CutWatch(coordinator, max_failed_cuts)
        self.retry_timeout_s = retry_timeout_s
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        #: how samples are drawn over the shards, and what they shipped (``sampler.traffic``, see :mod:`.draws`)
        self.sampler = Sampler(len(shards), capacity, beta, self.generator)
        self.writer_id = uuid.uuid4().hex
        self._turn = 0
        self._lock = threading.Lock()
        #: idle sequence streams ``[stream id, next seq]`` (see :meth:`_take`)
        self._idle: list[list[Any]] = []
        self._streams = 0  # streams made
        self._nodes: list[str] | None = None

    @classmethod
    def launch(
        cls,
        buffer_cls: type,
        *args: Any,
        num_shards: int = 1,
        checkpoint_path: str | None = None,
        checkpoint_every_s: float | None = None,
        keep_last: int = 2,
        rate_limiter: RateLimiter | None = None,
        resume: bool = False,
        max_restarts: int | None = None,
        retry_timeout_s: float = 30.0,
        actor_options: Mapping[str, Any] | None = None,
        coordinator_options: Mapping[str, Any] | None = None,
        placement: Any = None,
        max_failed_cuts: int = 3,
        shard_loss: Literal["degrade", "wait"] = "degrade",
        shard_timeout_s: float = 2.0,
        name: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        metrics: bool = True,
        **kwargs: Any,
    ) -> RemoteBuffer:
        """Start ``num_shards`` actors holding ``buffer_cls(*args, **kwargs)`` each (``seed`` differs per shard).

        Args:
            checkpoint_path: where checkpoint cuts go (:meth:`checkpoint`; restarted shards reload the last): a
                local folder (one node, or a file system every node mounts), ``file://...``, or a URI of shared
                or object storage fsspec opens (``s3://...``, ...; see :mod:`.location`). At launch every shard
                and the coordinator must write and read it (else :class:`~objectrl_buffer.errors.CheckpointError`
                and nothing stays started).
            checkpoint_every_s: take a cut this often (needs ``checkpoint_path``).
            keep_last: generations kept on disk (>= 1).
            rate_limiter: one limiter for all shards (:mod:`objectrl_buffer.flow`); its counters join the cuts.
            resume: start from the cut already at ``checkpoint_path`` (else the buffer starts empty).
            max_restarts: how often Ray restarts a dead shard or the coordinator (``-1``: always; default 3). A
                shard restarts from the last cut, so without ``checkpoint_path`` shards are not restarted (a
                restart would come back empty, its rows neither kept nor counted in :attr:`lost_rows`): a lost
                shard stays lost, and calls that need it raise
                :class:`~objectrl_buffer.errors.BufferUnavailable` (the coordinator still restarts: it rebuilds
                its counts from the shards).
            retry_timeout_s: how long a call retries a dead shard before
                :class:`~objectrl_buffer.errors.BufferUnavailable`.
            actor_options: Ray options of the shard actors (default ``{"num_cpus": 0}``).
            coordinator_options: Ray options of the coordinator actor (default: ``num_cpus=0`` on this driver's
                node; e.g. ``resources`` or a ``scheduling_strategy`` to keep it off the writers' nodes; see
                :mod:`.placement`).
            placement: where the shards run: ``None`` (Ray's scheduler), ``"spread"``, ``"strict_spread"``,
                ``"pack"`` (a placement group the buffer makes, removed by :meth:`kill`), a list of node ids (one
                per shard) or a Ray ``PlacementGroup`` of yours (see :mod:`.placement`).
            max_failed_cuts: after this many checkpoint cuts failed in a row, writes and samples raise
                :class:`~objectrl_buffer.errors.CheckpointError` until a cut succeeds (each failure is also
                counted in :meth:`checkpoint_status` and warned about in the driver).
            shard_loss: ``"degrade"`` (default): a handle goes on without a shard that does not answer, samples
                flagged ``"degraded"``; ``"wait"``: every call waits for every shard (see :mod:`.health`).
            shard_timeout_s: how long a shard's draw may take before a degraded sample leaves it out.
            name, namespace: make the buffer reachable from other drivers with :meth:`connect` (Ray named
                actors, see :mod:`.discovery`). detached: the actors outlive this driver (until :meth:`kill`).
            metrics: export the shards' and the limiter's numbers as Ray gauges (see :mod:`.observe`).

        Raises:
            ImportError: Ray is not installed. InvalidArgumentError: a bad argument, named; ``name`` in use in
                ``namespace``; ``actor_options`` that name the actors; ``detached`` without ``name``;
                ``max_restarts`` other than 0 for shards without ``checkpoint_path`` (in ``actor_options``);
                ``coordinator_options`` for a buffer that has no coordinator (no limiter, no checkpoints).
            CheckpointError: ``checkpoint_path`` cannot be opened, or is not one location every actor sees (the
                message names it and which shard or coordinator, on which node, could not see it).
        """
        ray = _ray()
        check_free(name, namespace, actor_options, detached)
        n = positive_int(num_shards, "num_shards")
        keep = positive_int(keep_last, "keep_last")
        retry_s = real_in(retry_timeout_s, "retry_timeout_s", 0.0, float("inf"))
        max_failed = positive_int(max_failed_cuts, "max_failed_cuts")
        if shard_loss not in SHARD_LOSS:
            raise InvalidArgumentError(f"shard_loss must be one of {SHARD_LOSS}, got {shard_loss!r}")
        shard_timeout = real_in(shard_timeout_s, "shard_timeout_s", 1e-3, float("inf"))
        if checkpoint_every_s is not None:
            if checkpoint_path is None:
                raise InvalidArgumentError("checkpoint_every_s needs a checkpoint_path")
            real_in(checkpoint_every_s, "checkpoint_every_s", 1e-3, float("inf"))
        if resume and checkpoint_path is None:
            raise InvalidArgumentError("resume needs a checkpoint_path")
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise InvalidArgumentError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        root = None if checkpoint_path is None else Location(str(checkpoint_path))
        restarts = _restarts(max_restarts, checkpoint_path is not None, actor_options)
        if not isinstance(metrics, bool):
            raise InvalidArgumentError(f"metrics must be True or False, got {metrics!r}")
        if coordinator_options is not None and rate_limiter is None and checkpoint_path is None:
            raise InvalidArgumentError(
                "coordinator_options: this buffer has no coordinator (it runs one for a rate_limiter or a "
                "checkpoint_path)"
            )
        options = dict(actor_options or {"num_cpus": 0})
        options.setdefault("max_restarts", restarts if checkpoint_path is not None else 0)
        coord_options = coordinator_actor_options(coordinator_options, restarts)
        placed = place_shards(placement, n, options)
        actor = ray.remote(Shard)
        seed = kwargs.pop("seed", None)
        buffer_id = uuid.uuid4().hex[:16]  # names the writers' folders a shard accepts (see Shard._map)
        shards: list[Any] = []
        coordinator = None
        try:  # a launch that fails leaves nothing started: no actor, no placement group of ours
            for i in range(n):
                shard_kwargs = dict(kwargs, seed=None if seed is None else seed + i)
                named = actor.options(**placed.options[i], **named_options(name, namespace, detached, f"shard-{i}"))
                shards.append(named.remote(buffer_cls, args, shard_kwargs, i, root, resume, buffer_id, bool(metrics)))
            capacity, num_envs = ray.get([shards[0].get.remote("buffer_size"), shards[0].get.remote("num_envs")])
            beta = ray.get(shards[0].get.remote("beta")) if hasattr(buffer_cls, "update_priority") else None
            if rate_limiter is not None or root is not None:
                # an async actor: a waiting admission is a coroutine, not a thread (see .coordinator)
                coord_options.update(named_options(name, namespace, detached, "coordinator"))
                coord = ray.remote(Coordinator).options(**coord_options, max_concurrency=100_000)
                coordinator = coord.remote(
                    shards,
                    rate_limiter,
                    int(capacity),
                    root,
                    checkpoint_every_s,
                    keep,
                    resume,
                    max_failed,
                    (name or buffer_id) if metrics else None,
                )
                if root is not None:
                    check_location(root.uri, coordinator, shards)
                ray.get(coordinator.counters.remote())  # started (and resumed) before the first write
        except BaseException:
            for started in [*shards, *([coordinator] if coordinator is not None else [])]:
                ray.kill(started, no_restart=True)
            if placed.group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(placed.group)
            raise
        handle = cls(
            shards,
            int(capacity),
            beta,
            seed,
            coordinator=coordinator,
            limited=rate_limiter is not None,
            num_envs=int(num_envs),
            retry_timeout_s=retry_s,
            max_failed_cuts=max_failed,
            buffer_id=buffer_id,
            shard_loss=shard_loss,
            shard_timeout_s=shard_timeout,
            name=name,
            namespace=namespace,
            placement_group=placed.group,
        )
        if name is not None:  # kept by the handle: an actor that no handle holds goes, named or not (unless detached)
            registry = ray.remote(Registry).options(num_cpus=0, **named_options(name, namespace, detached, None))
            handle.registry = registry.remote(handle.__reduce__()[1])
            ray.get(handle.registry.__ray_ready__.remote())
        return handle

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> RemoteBuffer:
        """A handle on the buffer launched with ``name`` in ``namespace`` (``None``: this job's), from any driver
        connected to its cluster (``ray.init(address=...)``); it writes under a writer id of its own.

        Raises:
            ImportError: Ray is not installed. InvalidArgumentError: no such buffer (see :mod:`.discovery`).
        """
        registry, parts = find(name, namespace)
        handle = _rebuild(*parts)
        handle.registry = registry
        return handle

    def __reduce__(self) -> tuple[Any, ...]:
        settings = {
            "coordinator": self.coordinator,
            "limited": self.limited,
            "num_envs": self.num_envs,
            "retry_timeout_s": self.retry_timeout_s,
            "max_failed_cuts": self.max_failed_cuts,
            "buffer_id": self.buffer_id,
            "shard_loss": self.health.mode,
            "shard_timeout_s": self.health.shard_timeout_s,
            "name": self.name,
            "namespace": self.namespace,
            "placement_group": self.placement_group,
        }
        return (_rebuild, (self.shards, self.capacity, self.beta, settings))

    def next_shard(self) -> int:
        """The number of the shard the next write goes to: the shards take writes in turn, a shard down
        skipped in degraded mode (see :mod:`.health`)."""
        live = self.health.live(self.shards)
        with self._lock:
            return self._next(live)

    def _next(self, live: list[int]) -> int:
        turn = self._turn % len(self.shards)
        self._turn += 1
        if turn in live:
            return turn
        self.health.rerouted_writes += 1
        return min(live, key=lambda i: (i - turn) % len(self.shards))  # the next live one in turn

    def _take(self) -> tuple[int, list[Any]]:
        """The shard of the next write and an idle sequence stream ``[stream id, next seq]``, held by this
        call alone until :meth:`_write` hands it back.

        Why streams: a shard stores a write only if its ``seq`` is above the last one applied for its stream
        id (a retried write is acknowledged, not stored again). One counter shared by threads breaks that:
        thread A takes seq n, thread B n + 1, B's call reaches the shard first, and A's write is acknowledged
        unstored. A stream is used by one call at a time, and handed back only once that call was answered,
        so each shard sees a stream's seqs in increasing order; concurrent calls use streams of their own
        (``<writer_id>:<k>``; as many as calls ever ran at once on this handle, each one entry in a shard's
        table of applied seqs). No lock is held across the round trip: ~0.1-0.2 us more a call than one
        shared counter, against a round trip of ~1 ms.
        """
        live = self.health.live(self.shards)
        with self._lock:
            turn = self._next(live)
            if self._idle:
                return turn, self._idle.pop()
            self._streams += 1
            return turn, [f"{self.writer_id}:{self._streams - 1}", 0]

    def _write(self, what: str, method: str, data: Any, rows: int, timeout: float | None) -> None:
        """Send ``data`` to the next shard's ``method`` under a sequence stream of its own (see :meth:`_take`),
        retried as :meth:`retry` does."""
        i, stream = self._take()
        writer, seq = stream
        stream[1] = seq + 1
        answered = False
        try:
            ticket = self.admit_insert(i, rows, timeout)
            submit = getattr(self.shards[i], method).remote
            self.retry(f"{what} to shard {i}", lambda: submit(data, writer, seq, ticket), shard=i)
            answered = True
        except (ReplayBufferError, _ray().exceptions.RayTaskError):  # answered, or the last try failed
            answered = True
            raise
        finally:
            if answered:  # else (interrupted) a call may still be on its way: the stream is not used again
                with self._lock:
                    self._idle.append(stream)

    def admit_insert(self, shard: int, rows: int, timeout: float | None) -> str | None:
        """Wait until the limiter admits ``rows`` bound for ``shard`` (at once without a limiter; see
        :mod:`.admission`: asked again of a restarted coordinator, never let through unadmitted); the
        admission's ticket, for the write to carry to the shard (``None`` without a limiter; see :mod:`.tickets`).

        Raises:
            RateLimitTimeout, RateLimitDeadlock, CheckpointError, BufferUnavailable: see :func:`.admission.admit`.
        """
        self.check_cuts()
        if not self.limited:
            return None
        coordinator = self.coordinator
        asked = Asked(lambda left: coordinator.admit_insert.remote(shard, rows, left), timeout)
        return admit(asked, f"insert of {rows} rows", self.retry_timeout_s)

    # ------------------------------------------------------------------ writes
    def add(self, transition: TensorDictBase | Mapping[str, Any], *, timeout: float | None = None) -> None:
        """The shards' ``add``, in turn (blocking; ``timeout``: the limiter's, see :mod:`.coordinator`).

        Raises:
            RateLimitTimeout, RateLimitDeadlock: not admitted (nothing written). BufferUnavailable: see
            :meth:`retry`. Anything the buffer's ``add`` raises (nothing written).
        """
        self._write("add", "add", to_numpy(transition), self.num_envs, timeout)

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any], *, timeout: float | None = None) -> None:
        """The shards' ``add_batch``, in turn: the whole batch to one shard (blocking). Raises as :meth:`add`."""
        data = to_numpy(batch)
        self._write("add_batch", "add_batch", data, batch_rows(data, self.num_envs), timeout)

    def writer(
        self, batch_size: int = 256, flush_every_s: float = 0.1, max_in_flight: int = 2, same_node: bool | None = None
    ) -> Writer:
        """A client-side batcher of single adds (see :class:`Writer`; ``same_node``: how batches reach a shard
        on this process's node: ``None`` through shared files when they can be made, ``False`` through Ray,
        ``True`` through shared files or :class:`~objectrl_buffer.errors.InvalidArgumentError`)."""
        return Writer(self, batch_size, flush_every_s, max_in_flight, same_node)

    def node_ids(self) -> list[str]:
        """The Ray node id of each shard (asked once, then cached)."""
        if self._nodes is None:
            self._nodes = [str(n) for n in self.retry("node_id", lambda: [s.node_id.remote() for s in self.shards])]
        return self._nodes

    def transports(self) -> dict[str, int]:
        """Batches the shards stored since their actors started, by how their rows came: ``"mapped"`` (from a
        same-node writer's files) and ``"payload"`` (through Ray)."""
        got = self.retry("transports", lambda: [s.transports.remote() for s in self.shards])
        return {kind: sum(g[kind] for g in got) for kind in ("mapped", "payload")}

    # ------------------------------------------------------------------ reads
    def stats(self) -> BufferStats:
        """The buffer's numbers, per shard and in all (see :class:`.observe.BufferStats`): rows, inserts and
        rows sampled with their rates since this handle's previous call, lost and pending rows, restarts, the
        limiter's counters and blocked time, the last cut's age, this handle's sample traffic and its view of
        the shards' health. Waits for every shard (a shard restarting: until it is back).

        Raises:
            BufferUnavailable: see :meth:`retry`.
        """
        shards: list[ShardStats] = list(self.retry("stats", lambda: [s.usage.remote() for s in self.shards]))
        limiter: LimiterStats | None = None
        cuts: dict[str, Any] = {}
        if self.coordinator is not None:
            limiter = self.retry("stats", lambda: self.coordinator.usage.remote())
            cuts = dict(self.retry("stats", lambda: self.coordinator.cut_status.remote()))
        traffic = dataclasses.asdict(self.sampler.traffic)
        return self._rates.stats(shards, limiter, cuts.get("last_cut_age_s"), traffic, dict(self.health.snapshot()))

    def masses(self) -> list[tuple[int, float]]:
        """``(rows, mass)`` of each shard (mass: a prioritized shard's priority mass, else its rows)."""
        got = self.retry("stats", lambda: [s.stats.remote() for s in self.shards])
        return [(rows, mass) for rows, mass, _ in got]

    @property
    def lost_rows(self) -> int:
        """Rows the shards held that their restarts dropped: written after the last checkpoint and not re-sent."""
        got = self.retry("stats", lambda: [s.stats.remote() for s in self.shards])
        return sum(lost for _, _, lost in got)

    def __len__(self) -> int:
        return sum(rows for rows, _ in self.masses())

    # ------------------------------------------------------------------ the rest
    def checkpoint(self) -> int:
        """Take a cut of every shard and the limiter now, under one manifest (see :mod:`.coordinator`); its generation.

        Raises:
            InvalidArgumentError: launched without ``checkpoint_path``.
        """
        if self.coordinator is None:
            raise InvalidArgumentError("checkpoint: launch the buffer with checkpoint_path=...")
        return int(self.retry("checkpoint", lambda: self.coordinator.checkpoint.remote()))

    def checkpoint_status(self) -> dict[str, Any]:
        """How the checkpoint cuts fare: ``failed_cuts`` (failed since the coordinator started), ``failing`` (in a
        row), ``last_cut_age_s`` (seconds since the last good cut; ``None``: none yet), ``last_error``,
        ``skipped_cuts`` and ``max_failed_cuts`` (empty without a coordinator). A failure not seen before is
        warned about here too (see :mod:`.cut_watch`).

        Raises:
            CheckpointError: ``max_failed_cuts`` cuts failed in a row (see :meth:`launch`).
        """
        if self.cuts is None:
            return {}
        status = dict(self.retry("checkpoint_status", lambda: self.coordinator.cut_status.remote()))
        self.cuts.saw(status)
        return status

    def limiter_counters(self) -> dict[str, int]:
        """The shared limiter's ``inserts``, ``samples``, ``deletes`` (empty without one)."""
        if self.coordinator is None:
            return {}
        return dict(self.retry("limiter_counters", lambda: self.coordinator.counters.remote()))

    def save(self, path: str, data: bool = False) -> None:
        """Each shard's ``save`` to ``<path>.shard-<i>`` (for one cut of them all, restored together, use
        :meth:`checkpoint`)."""
        self.retry("save", lambda: [s.save.remote(f"{path}.shard-{i}", data) for i, s in enumerate(self.shards)])

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``buffer.<name>(*args, **kwargs)`` on every shard; their results. Only the read methods in
        :data:`.shard.CALLABLE` (``sample_all``, ``__len__``, the ``sample*`` methods, ...): writes go through
        :meth:`add` / :meth:`add_batch` / :meth:`writer`, saves through :meth:`save` / :meth:`checkpoint`.

        Raises:
            InvalidArgumentError: any other name (nothing called).
        """
        return list(self.retry(name, lambda: [s.call.remote(name, *args, **kwargs) for s in self.shards]))

    def kill(self, close_timeout_s: float = 30.0) -> None:
        """Close every shard's buffer, then stop the shard actors (and the coordinator, and a named buffer's
        registry, freeing its name) for good.

        Closing frees each shard's storage: its folder under ``storage_dir`` (or ``/dev/shm``) and the files in
        it go. A shard that has not closed within ``close_timeout_s`` (dead, or busy) is killed as it is; its
        folder is then an orphan whose lock the kernel freed, removed by ``objectrl-buffer clean`` or the next
        buffer's sweep of that folder.
        """
        ray = _ray()
        closing = [shard.close.remote() for shard in self.shards]
        ray.wait(closing, num_returns=len(closing), timeout=close_timeout_s)
        for ref in closing:
            with contextlib.suppress(ray.exceptions.RayError):  # GetTimeoutError too: killed as it is
                ray.get(ref, timeout=0)
        actors = [*self.shards, *([self.coordinator] if self.coordinator is not None else [])]
        if self.name is not None:  # the registry, which keeps the name taken
            with contextlib.suppress(ValueError):  # killed already
                actors.append(ray.get_actor(self.name, namespace=self.namespace))
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)


def _restarts(max_restarts: int | None, checkpoints: bool, actor_options: Mapping[str, Any] | None) -> int:
    """The actors' ``max_restarts`` (see :meth:`RemoteBuffer.launch`).

    Raises:
        InvalidArgumentError: not an int >= -1; shards restarted without checkpoints (they would come back empty).
    """
    restarts = 3 if max_restarts is None else max_restarts
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < -1:
        raise InvalidArgumentError(f"max_restarts must be an int >= -1 (-1: always), got {max_restarts!r}")
    shard_restarts = dict(actor_options or {}).get("max_restarts", 0 if max_restarts is None else max_restarts)
    if not checkpoints and shard_restarts != 0:
        raise InvalidArgumentError(
            f"max_restarts={shard_restarts} without a checkpoint_path: a shard restarts from the last checkpoint "
            "cut, so without one it would come back empty and its rows would be lost uncounted; give a "
            "checkpoint_path, or leave max_restarts out (shards are then not restarted)"
        )
    return restarts


def _rebuild(shards: list[Any], capacity: int, beta: float | None, settings: dict[str, Any]) -> RemoteBuffer:
    return RemoteBuffer(shards, capacity, beta, **settings)
