"""A buffer served by Ray actors (the ``ray`` extra): one actor per shard, a handle with the buffer's methods.

``RemoteBuffer.launch(buffer_cls, *args, num_shards=..., **kwargs)`` starts ``num_shards`` actors
(:class:`~.shard.Shard`), each holding ``buffer_cls(*args, **kwargs)``, and, when a rate limiter or
checkpoints are asked for, one :class:`~.coordinator.Coordinator` actor. Payloads travel as NumPy arrays
(Ray's zero-copy path; torch tensors are pickled copies, 10-40x slower); Ray carries the calls.

* Writes go to the shards in turn (``add``, ``add_batch``); :meth:`RemoteBuffer.writer` batches single adds
  client-side into preallocated columns, with at most ``max_in_flight`` batches on their way. Every write
  carries ``(stream id, seq)``: a write retried after a shard restart is stored exactly once, and so is each
  acknowledged write of threads sharing one handle (each call in flight has a stream of its own, see
  ``RemoteBuffer._take``) or one :class:`Writer` (its calls take turns on a lock). A writer on a
  shard's own node keeps its columns in files of its own in ``/dev/shm`` and sends that shard only a small
  :class:`~.shard.SharedRows` descriptor: the shard copies the rows straight from its mapping of the files
  (no serialization, no object store).
* :meth:`RemoteBuffer.sample_batch` is one round trip: every non-empty shard draws ``batch_size`` rows by its
  own rule and reports its mass (rows; prioritized: ``sum (p + eps) ** alpha``), the handle splits the batch by
  a multinomial draw proportional to the masses and keeps that many of each shard's rows: every row has
  the probability it would have in one big buffer. Importance weights are recomputed over the whole batch.
  ``"index"`` is global (``shard * capacity + slot``); ``"generation"`` says which write of that slot was drawn.
  (With ``S`` shards, ``S * batch_size`` rows cross the wire: cheap for small rows, the price of one round trip.)
* :meth:`RemoteBuffer.update_priority` ignores updates to slots rewritten since they were sampled (given the
  batch's ``"generation"``) and returns how many it applied.
* :meth:`RemoteBuffer.prefetch` keeps ``depth`` samples in flight as Ray refs (no helper thread): the learner
  finds the next batch ready while it trains on this one.
* Faults: a call that meets a dead shard is retried (Ray restarts the actor from the last checkpoint) until
  ``retry_timeout_s``, then :class:`~objectrl_buffer.errors.BufferUnavailable`; :attr:`RemoteBuffer.lost_rows`
  says how many stored rows the restarts dropped. A handle pickles into Ray tasks and actors (each copy
  writes under its own writer id).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.core.keys import INDEX_KEY, WEIGHT_KEY
from objectrl_buffer.core.schema import Key, Schema
from objectrl_buffer.core.validate import positive_int, real_in
from objectrl_buffer.distributed.coordinator import Coordinator
from objectrl_buffer.distributed.shard import (
    GENERATION_KEY,
    MISSING,
    RAW_WEIGHT,
    Shard,
    SharedRows,
    column_path,
    flat,
    to_numpy,
    unpack,
)
from objectrl_buffer.errors import BufferUnavailable, EmptyBufferError, InvalidArgumentError, ReplayBufferError
from objectrl_buffer.flow.limited import batch_rows
from objectrl_buffer.flow.limiter import RateLimiter
from objectrl_buffer.storage.fast_write import FastWriter
from objectrl_buffer.storage.folders import make_owned, sweep_once
from objectrl_buffer.storage.placement import SHM_DIR, default_parent, is_tmpfs, reserve
from objectrl_buffer.storage.table import make_tensordict

__all__ = ["RemoteBuffer", "Shard", "Writer", "GENERATION_KEY", "to_numpy"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "objectrl_buffer.distributed.RemoteBuffer needs Ray: pip install 'objectrl_buffer[ray]'"
        ) from None
    return ray


class RemoteBuffer:
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
    ) -> None:
        self.shards, self.capacity, self.beta = shards, capacity, beta
        self.coordinator, self.limited, self.num_envs = coordinator, limited, num_envs
        self.retry_timeout_s = retry_timeout_s
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
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
        max_restarts: int = 3,
        retry_timeout_s: float = 30.0,
        actor_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> RemoteBuffer:
        """Start ``num_shards`` actors holding ``buffer_cls(*args, **kwargs)`` each (``seed`` differs per shard).

        Args:
            checkpoint_path: a folder for checkpoint cuts (:meth:`checkpoint`; restarted shards reload the last).
            checkpoint_every_s: take a cut this often (needs ``checkpoint_path``).
            keep_last: generations kept on disk (>= 1).
            rate_limiter: one limiter for all shards (:mod:`objectrl_buffer.flow`); its counters join the cuts.
            resume: start from the cut already at ``checkpoint_path`` (else the buffer starts empty).
            max_restarts: how often Ray restarts a dead shard (``-1``: always).
            retry_timeout_s: how long a call retries a dead shard before
                :class:`~objectrl_buffer.errors.BufferUnavailable`.
            actor_options: Ray options of the shard actors (default ``{"num_cpus": 0}``).

        Raises:
            ImportError: Ray is not installed. InvalidArgumentError: a bad argument, named.
        """
        ray = _ray()
        n = positive_int(num_shards, "num_shards")
        keep = positive_int(keep_last, "keep_last")
        retry_s = real_in(retry_timeout_s, "retry_timeout_s", 0.0, float("inf"))
        if checkpoint_every_s is not None:
            if checkpoint_path is None:
                raise InvalidArgumentError("checkpoint_every_s needs a checkpoint_path")
            real_in(checkpoint_every_s, "checkpoint_every_s", 1e-3, float("inf"))
        if resume and checkpoint_path is None:
            raise InvalidArgumentError("resume needs a checkpoint_path")
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise InvalidArgumentError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        root = None if checkpoint_path is None else str(checkpoint_path)
        options = dict(actor_options or {"num_cpus": 0})
        options.setdefault("max_restarts", max_restarts)
        actor = ray.remote(Shard).options(**options)
        seed = kwargs.pop("seed", None)
        shards = []
        for i in range(n):
            shard_kwargs = dict(kwargs, seed=None if seed is None else seed + i)
            shards.append(actor.remote(buffer_cls, args, shard_kwargs, i, root, resume))
        capacity, num_envs = ray.get([shards[0].get.remote("buffer_size"), shards[0].get.remote("num_envs")])
        beta = ray.get(shards[0].get.remote("beta")) if hasattr(buffer_cls, "update_priority") else None
        coordinator = None
        if rate_limiter is not None or root is not None:
            coord = ray.remote(Coordinator).options(num_cpus=0, max_concurrency=64, max_restarts=max_restarts)
            coordinator = coord.remote(shards, rate_limiter, int(capacity), root, checkpoint_every_s, keep, resume)
            ray.get(coordinator.counters.remote())  # started (and resumed) before the first write
        return cls(
            shards,
            int(capacity),
            beta,
            seed,
            coordinator=coordinator,
            limited=rate_limiter is not None,
            num_envs=int(num_envs),
            retry_timeout_s=retry_s,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        settings = {
            "coordinator": self.coordinator,
            "limited": self.limited,
            "num_envs": self.num_envs,
            "retry_timeout_s": self.retry_timeout_s,
        }
        return (_rebuild, (self.shards, self.capacity, self.beta, settings))

    # ------------------------------------------------------------------ calls that survive a shard restart
    def retry(self, what: str, submit: Callable[[], Any]) -> Any:
        """``ray.get(submit())``, submitted again while the actor is dead or restarting, for up to
        ``retry_timeout_s``; errors of ours raised in the actor come out as themselves.

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

    def next_shard(self) -> int:
        """The number of the shard the next write goes to (the shards take writes in turn)."""
        with self._lock:
            self._turn += 1
            return (self._turn - 1) % len(self.shards)

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
        with self._lock:
            turn = self._turn % len(self.shards)
            self._turn += 1
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
            admitted = self.admission(i, rows, timeout)
            submit = getattr(self.shards[i], method).remote
            self.retry(f"{what} to shard {i}", lambda: submit(data, writer, seq, admitted))
            answered = True
        except (ReplayBufferError, _ray().exceptions.RayTaskError):  # answered, or the last try failed
            answered = True
            raise
        finally:
            if answered:  # else (interrupted) a call may still be on its way: the stream is not used again
                with self._lock:
                    self._idle.append(stream)

    def admission(self, shard: int, rows: int, timeout: float | None) -> Any:
        """The limiter's admission ref of ``rows`` bound for ``shard`` (``None`` without a limiter)."""
        if not self.limited:
            return None
        return self.coordinator.admit_insert.remote(shard, rows, timeout)

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
    def stats(self) -> list[tuple[int, float]]:
        """``(rows, mass)`` of each shard."""
        got = self.retry("stats", lambda: [s.stats.remote() for s in self.shards])
        return [(rows, mass) for rows, mass, _ in got]

    @property
    def lost_rows(self) -> int:
        """Rows the shards held that their restarts dropped: written after the last checkpoint and not re-sent."""
        got = self.retry("stats", lambda: [s.stats.remote() for s in self.shards])
        return sum(lost for _, _, lost in got)

    def __len__(self) -> int:
        return sum(rows for rows, _ in self.stats())

    def submit_sample(self, batch_size: int, timeout: float | None = None) -> list[Any]:
        """The refs of one :meth:`sample_batch` (see :meth:`finish_sample`): admission, then each shard's draw."""
        admitted = self.coordinator.admit_sample.remote(batch_size, timeout) if self.limited else None
        return [shard.sample.remote(batch_size, admitted) for shard in self.shards]

    def finish_sample(self, batch_size: int, refs: list[Any], timeout: float | None = None) -> TensorDict:
        """The batch of :meth:`submit_sample` ``refs`` (drawn again if a shard died meanwhile, or if the limiter
        admitted it before any admitted row had landed: see :meth:`draw_admitted`)."""
        ray = _ray()
        try:
            got = _get_all(refs)
        except ray.exceptions.RayActorError:
            got = self.retry("sample_batch", lambda: [s.sample.remote(batch_size) for s in self.shards])
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ReplayBufferError):
                raise exc.cause from None
            raise
        refused = next((draw for draw in got if isinstance(draw, ReplayBufferError)), None)
        if refused is not None:  # the limiter's refusal, handed back by the shards
            raise refused
        try:
            return self.assemble(batch_size, got)
        except EmptyBufferError:
            if not self.limited:
                raise
        return self.draw_admitted(batch_size, timeout)

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
            got = self.retry("sample_batch", lambda: [s.sample.remote(batch_size) for s in self.shards])
            try:
                return self.assemble(batch_size, got)
            except EmptyBufferError:
                if time.monotonic() >= deadline:
                    raise

    def assemble(self, batch_size: int, got: list[bytes]) -> TensorDict:
        """One batch of ``batch_size`` rows from each shard's packed draw (see the module docs)."""
        if len(got) == 1:  # the whole draw: views of one writable copy of its bytes
            mass, _, out = unpack(got[0])
            if not mass > 0:
                raise EmptyBufferError("no shard holds a row to sample")
        else:
            draws = [unpack(packed, copy=False) for packed in got]
            masses = [mass for mass, _, _ in draws]
            if not sum(masses) > 0:
                raise EmptyBufferError("no shard holds a row to sample")
            weights = torch.tensor(masses, dtype=torch.float64)
            picks = torch.multinomial(weights, batch_size, replacement=True, generator=self.generator)
            counts = np.bincount(picks.numpy(), minlength=len(got))
            which = np.flatnonzero(counts)
            kept = counts[which]
            # the first counts[i] rows of each shard's draw; np.concatenate copies them out of the bytes
            parts = [draws[i][2] for i in which]
            out = {key: np.concatenate([p[key][:c] for c, p in zip(kept, parts, strict=True)]) for key in parts[0]}
            out[INDEX_KEY] += np.repeat(which.astype(np.int64) * self.capacity, kept)
        values: dict[Key, torch.Tensor] = {}
        nested = False
        for key, value in out.items():
            if key == RAW_WEIGHT:
                if self.beta is not None:  # weights over the whole batch, as one buffer's
                    raw = torch.from_numpy(value)
                    values[WEIGHT_KEY] = (raw / raw.min()).pow(-self.beta).to(torch.float32)
            elif "." in key:  # a nested key, flattened for the trip
                values[tuple(key.split("."))] = torch.from_numpy(value)
                nested = True
            else:
                values[key] = torch.from_numpy(value)
        return make_tensordict(values, torch.Size([batch_size]), None, nested)

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
                refs = queue.popleft()
                queue.append(self.submit_sample(k, timeout))
                batch = self.finish_sample(k, refs, timeout)
                del refs
                yield batch
        finally:
            queue.clear()

    def update_priority(self, index: Any, priority: Any, generation: Any = None) -> int:
        """Set priorities at global ``index`` (a sample's ``"index"``); with the sample's ``"generation"``,
        slots rewritten since are skipped. Returns how many were applied."""
        slots = torch.as_tensor(index).reshape(-1).numpy().astype(np.int64)
        values = torch.as_tensor(priority, dtype=torch.float64).reshape(-1).numpy()
        gens = None if generation is None else torch.as_tensor(generation).reshape(-1).numpy().astype(np.int64)
        if len(values) != len(slots) or (gens is not None and len(gens) != len(slots)):
            raise InvalidArgumentError("update_priority: index, priority and generation must have one value per row")
        shard_of = slots // self.capacity
        parts = []
        for i in np.unique(shard_of).tolist():
            if not 0 <= i < len(self.shards):
                raise InvalidArgumentError(f"update_priority: index {int(slots[shard_of == i][0])} names no shard")
            mask = shard_of == i
            parts.append((i, slots[mask] % self.capacity, values[mask], None if gens is None else gens[mask]))
        return int(
            sum(
                self.retry("update_priority", lambda: [self.shards[p[0]].update_priority.remote(*p[1:]) for p in parts])
            )
        )

    # ------------------------------------------------------------------ the rest
    def checkpoint(self) -> int:
        """Take a consistent cut of every shard and the limiter now (see :mod:`.coordinator`); its generation.

        Raises:
            InvalidArgumentError: launched without ``checkpoint_path``.
        """
        if self.coordinator is None:
            raise InvalidArgumentError("checkpoint: launch the buffer with checkpoint_path=...")
        return int(self.retry("checkpoint", lambda: self.coordinator.checkpoint.remote()))

    def limiter_counters(self) -> dict[str, int]:
        """The shared limiter's ``inserts``, ``samples``, ``deletes`` (empty without one)."""
        if self.coordinator is None:
            return {}
        return dict(self.retry("limiter_counters", lambda: self.coordinator.counters.remote()))

    def save(self, path: str, data: bool = False) -> None:
        """Each shard's ``save`` to ``<path>.shard-<i>`` (for one consistent cut use :meth:`checkpoint`)."""
        self.retry(
            "save", lambda: [s.call.remote("save", f"{path}.shard-{i}", data) for i, s in enumerate(self.shards)]
        )

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``buffer.<name>(*args, **kwargs)`` on every shard; their results."""
        return list(self.retry(name, lambda: [s.call.remote(name, *args, **kwargs) for s in self.shards]))

    def kill(self) -> None:
        """Stop the shard actors (and the coordinator) for good."""
        ray = _ray()
        for actor in [*self.shards, *([self.coordinator] if self.coordinator is not None else [])]:
            ray.kill(actor, no_restart=True)


def _get_all(refs: list[Any]) -> list[Any]:
    """``ray.get`` of each ref, the first error raised only after every ref was fetched (an error left in a
    ref that nobody fetched is logged by Ray as unhandled)."""
    ray = _ray()
    out, error = [], None
    for ref in refs:
        try:
            out.append(ray.get(ref))
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
    return out


def _rebuild(shards: list[Any], capacity: int, beta: float | None, settings: dict[str, Any]) -> RemoteBuffer:
    return RemoteBuffer(shards, capacity, beta, **settings)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class _Columns:
    """One batch being filled: preallocated NumPy columns of ``batch_size`` rows and the library's compiled
    per-schema row writer over them (:func:`~objectrl_buffer.storage.row_writer.compile_row_writer`, the
    single-process ``add``'s fast path): one call checks a plain row's keys, dtypes and shapes and stores it,
    or declines (nothing written).

    With a ``folder``, the columns are files there (set ``index``, :func:`~.shard.column_path`), their pages
    reserved up front (a full tmpfs raises ``OSError`` here, never ``SIGBUS`` on a later write), mapped
    shared: a shard on this node reads them as they are.

    Raises:
        OSError: the files could not be made (none are left behind).
    """

    def __init__(self, schema: Schema, batch_size: int, folder: str | None = None, index: int = 0) -> None:
        self.folder, self.index, self.capacity = folder, index, batch_size
        self.layout = tuple(
            (str(field.key), _numpy_dtype(field.dtype).str, tuple(field.shape)) for field in schema.fields
        )
        if folder is None:
            self.columns: dict[str, np.ndarray] = {
                key: np.empty((batch_size, *shape), dtype=dtype) for key, dtype, shape in self.layout
            }
        else:
            paths = [column_path(folder, index, j) for j in range(len(self.layout))]
            try:
                self.columns = {
                    key: np.asarray(np.memmap(path, np.dtype(dtype), "w+", 0, (batch_size, *shape)))
                    for path, (key, dtype, shape) in zip(paths, self.layout, strict=True)
                }
                reserve(paths)
            except (OSError, ValueError) as exc:
                for path in paths:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise OSError(f"writer column files in {folder}: {exc}") from None
        views = {field.key: self.columns[str(field.key)] for field in schema.fields}
        self.write_row = FastWriter(schema, views).write_row

    def rows(self, n: int) -> dict[str, np.ndarray]:
        """The first ``n`` rows of each column (views)."""
        return {key: column[:n] for key, column in self.columns.items()}

    def shared(self, n: int) -> SharedRows:
        """The descriptor of the first ``n`` rows (only for a set in files)."""
        assert self.folder is not None
        return SharedRows(self.folder, self.index, n, self.capacity, self.layout)


def _remove_folder(folder: str, lock_fd: int) -> None:
    """Remove a writer's folder, then let go of its lock (run at :meth:`Writer.close` or process exit)."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


def _declined(data: Any, slot: int, cast_ok: Any = ()) -> bool:
    """The row writer before the first row: declines every row (the first row fixes the schema)."""
    return False


class Writer:
    """Batches single ``add`` s client-side into ``add_batch`` calls of ``batch_size`` rows (or whatever is
    pending after ``flush_every_s``), with at most ``max_in_flight`` batches unacknowledged; a batch that
    meets a restarting shard is sent again under its ``(writer_id, seq)`` (stored once). Use as a context
    manager or call :meth:`flush`.

    The first row fixes the schema (keys, per-row shapes and dtypes, as a buffer's first ``add`` does: a
    Python float is stored as ``torch.get_default_dtype()``); rows are copied into preallocated NumPy columns
    by the library's compiled row writer (~0.3 us a key for the plain form an env loop hands over: NumPy
    arrays, Python numbers, CPU tensors). Anything else is checked by the schema's full rules, cast and
    stored, or refused with a :class:`~objectrl_buffer.errors.SchemaError` naming the key. The columns of a
    batch on its way are kept until the shard acknowledges it (a retry sends them again), then reused: at
    most ``max_in_flight + 1`` sets exist.

    Threads may share a writer: its calls take turns on a lock (held while a call waits for room in flight,
    as that call would wait alone), so every row an ``add`` accepted is sent once, in one stream of seqs
    (the lock costs ~0.1-0.2 us an ``add``). A writer per thread never waits for another thread's send.

    ``flush_every_s`` is checked at each ``add`` (a writer that stops adding sends its pending rows at
    :meth:`flush` or on leaving its ``with`` block).

    Same node (``same_node`` not ``False``): when a shard runs on this process's Ray node, the column sets are
    files in a private folder (:attr:`folder`, in ``/dev/shm`` when all ``max_in_flight + 1`` sets take at most
    a quarter of its room, see :mod:`~objectrl_buffer.storage.placement`; else no files and every batch goes
    through Ray), and a batch bound for such a shard travels as a :class:`~.shard.SharedRows` descriptor: the
    shard copies the rows from its mapping of the files. A set is refilled only once its batch is acknowledged,
    so a batch retried after a shard restart still finds its rows there (the restarted shard maps the files
    anew). Batches bound for shards on other nodes travel through Ray as before. The folder goes at
    :meth:`close` (also on leaving the ``with`` block) or at process exit; the kernel-held lock in it lets the
    next writer's sweep remove it if this process is killed outright.
    """

    def __init__(
        self,
        remote: RemoteBuffer,
        batch_size: int,
        flush_every_s: float,
        max_in_flight: int,
        same_node: bool | None = None,
    ) -> None:
        self.remote = remote
        self.batch_size = positive_int(batch_size, "batch_size")
        self.flush_every_s = real_in(flush_every_s, "flush_every_s", 0.0, float("inf"))
        self.max_in_flight = positive_int(max_in_flight, "max_in_flight")
        if same_node not in (None, True, False):
            raise InvalidArgumentError(f"same_node must be None, True or False, got {same_node!r}")
        self.same_node = same_node
        #: the folder of this writer's column files (``None``: every batch travels through Ray)
        self.folder: str | None = None
        self.local: list[bool] = []  # per shard: on this process's node (batches as descriptors)
        self.sets = 0  # column sets made
        self._decided = same_node is False
        self._finalizer: weakref.finalize | None = None
        self.writer_id = uuid.uuid4().hex
        self.schema: Schema | None = None
        self.keys: frozenset[str] = frozenset()
        self.batch: _Columns | None = None  # the set being filled
        self.spare: list[_Columns] = []  # sets whose batches were acknowledged
        self.write_row: Callable[..., bool] = _declined  # the filled set's row writer
        self.filled = 0
        self.seq = 0
        #: ``(ref, shard, seq, batch or its SharedRows, admission, column set or None)`` of each batch not yet
        #: acknowledged.
        self.in_flight: deque[tuple[Any, int, int, Any, Any, _Columns | None]] = deque()
        self.deadline = time.monotonic() + self.flush_every_s
        #: held by each public call: threads sharing this writer take turns (its batches, sets and seqs are
        #: one stream; see the class docs)
        self._lock = threading.Lock()

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """The columns being filled (``{}`` before the first row)."""
        return {} if self.batch is None else self.batch.columns

    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> None:
        """Queue one transition (sent with the next batch).

        An earlier batch's refusal (a :class:`~objectrl_buffer.errors.SchemaError` from the shard, say) is
        raised by the add whose full batch could not be sent because of it; that add's row is queued all the
        same, and the batch goes with the next add or :meth:`flush`: no row is lost or added twice.

        Raises:
            InvalidArgumentError: its keys differ from the first row's. SchemaError: a value does not fit the
            first row's schema (named). Nothing is queued then.
        """
        lock = self._lock
        lock.acquire()  # not a with block: ~0.1 us less a row on CPython 3.11
        try:
            if self.filled >= self.batch_size:  # a full batch whose send failed: it goes first
                self._send()
            i = self.filled
            if not self.write_row(transition, i):
                self._add_checked(transition, i)
            self.filled = i + 1
            if self.filled >= self.batch_size or time.monotonic() >= self.deadline:
                self._send()
        finally:
            lock.release()

    def _add_checked(self, transition: TensorDictBase | Mapping[str, Any], i: int) -> None:
        """The rows the compiled writer declined: the schema's full check, then the copy (or the error)."""
        row = flat(transition)  # tensors kept: a 0-d float64 tensor fixes a float64 column, as in a buffer
        if self.schema is None:
            self.schema, _ = Schema.infer(row, batch_dims=0)
            self.keys = frozenset(str(field.key) for field in self.schema.fields)
        if self.batch is None:
            self.batch = self._new_set()
            self.write_row = self.batch.write_row
        if row.keys() - {INDEX_KEY} != self.keys:
            raise InvalidArgumentError(
                f"writer.add: keys {sorted(row)} differ from the first row's {sorted(self.keys)}"
            )
        pairs, _ = self.schema.check(row, batch_dims=0)
        assert self.batch is not None
        for field, value in pairs:  # checked and converted: the copy cannot fail halfway
            column = self.batch.columns[str(field.key)]
            column[i] = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> None:
        """Send a whole batch (after the single adds queued before it) without waiting for it to be stored:
        at most ``max_in_flight`` batches are on their way."""
        data = to_numpy(batch)
        with self._lock:
            self._send()
            self._dispatch(data, None)

    def _new_set(self) -> _Columns:
        """A fresh column set: in this writer's files when a shard shares its node, else plain memory."""
        assert self.schema is not None
        if not self._decided:
            self._open_folder()  # raises with same_node=True and no files: asked again at the next add
            self._decided = True
        if self.folder is not None:
            try:
                columns = _Columns(self.schema, self.batch_size, self.folder, self.sets)
                self.sets += 1
                return columns
            except OSError:
                if self.same_node:
                    raise
        return _Columns(self.schema, self.batch_size)

    def _open_folder(self) -> None:
        """Make this writer's folder if a shard shares its node and the sets fit (see the class docs)."""
        assert self.schema is not None
        ray = _ray()
        me = str(ray.get_runtime_context().get_node_id())
        self.local = [node == me for node in self.remote.node_ids()]
        row_bytes = sum(math.prod(f.shape) * _numpy_dtype(f.dtype).itemsize for f in self.schema.fields)
        need = (self.max_in_flight + 1) * self.batch_size * row_bytes
        parent = default_parent(need)
        why = None
        if not any(self.local):
            why = "no shard runs on this node"
        elif not row_bytes or not all(math.prod(f.shape) for f in self.schema.fields):
            why = "a column holds no bytes"
        elif parent != SHM_DIR and not is_tmpfs(parent):
            why = f"{need} bytes of column sets do not fit in {SHM_DIR}"
        if why is None:
            try:
                sweep_once(parent)
                folder, fd = make_owned(parent)
            except OSError as exc:
                why = f"no folder in {parent}: {exc}"
            else:
                self._finalizer = weakref.finalize(self, _remove_folder, folder, fd)
                shards = [s for s, local in zip(self.remote.shards, self.local, strict=True) if local]
                sees = self.remote.retry("sees", lambda: [s.sees.remote(folder) for s in shards])
                seen = iter(sees)
                self.local = [local and next(seen) for local in self.local]
                if any(self.local):
                    self.folder = folder
                else:
                    self._finalizer()
                    self._finalizer = None
                    why = f"no shard on this node sees {folder}"
        if why is not None and self.same_node:
            raise InvalidArgumentError(f"writer(same_node=True): {why}")

    def _send(self) -> None:
        self.deadline = time.monotonic() + self.flush_every_s
        if not self.filled or self.batch is None or self.schema is None:
            return
        full, n = self.batch, self.filled
        self.batch, self.write_row, self.filled = None, _declined, 0
        try:  # sent first: the wait for room in flight frees a set to fill next (max_in_flight + 1 sets in all)
            self._dispatch(full.rows(n), full)
        except BaseException:  # not sent (an earlier batch's error): kept pending, sent by the next send
            self.batch, self.write_row, self.filled = full, full.write_row, n
            raise
        self.batch = self.spare.pop() if self.spare else self._new_set()
        self.write_row = self.batch.write_row

    def _dispatch(self, batch: dict[str, Any], columns: _Columns | None) -> None:
        while len(self.in_flight) >= self.max_in_flight:
            self._settle()  # bounded: no refs pile up
        remote = self.remote
        shard = remote.next_shard()
        admitted = remote.admission(shard, batch_rows(batch, remote.num_envs), None)
        payload: dict[str, Any] | SharedRows = batch
        if columns is not None and columns.folder is not None and self.local[shard]:
            payload = columns.shared(len(next(iter(batch.values()))))  # the rows stay in the files
        entry = (None, shard, self.seq, payload, admitted, columns)
        self.in_flight.append((self._submit(entry), *entry[1:]))
        self.seq += 1

    def _submit(self, entry: tuple[Any, int, int, Any, Any, _Columns | None]) -> Any:
        _, shard, seq, batch, admitted, _ = entry
        return self.remote.shards[shard].add_batch.remote(batch, self.writer_id, seq, admitted)

    def _done(self) -> None:
        """The oldest batch is acknowledged (or refused): its columns may be filled again."""
        columns = self.in_flight.popleft()[5]
        if columns is not None:
            self.spare.append(columns)

    def _settle(self) -> None:
        """Wait for the oldest batch. If its shard died, wait out the restart and send it and every later
        batch again, in order (shards that stored one already acknowledge it without storing it twice).

        Raises:
            BufferUnavailable: the shard did not come back (see :meth:`RemoteBuffer.retry`).
        """
        ray = _ray()
        try:
            written = ray.get(self.in_flight[0][0])
        except ray.exceptions.RayActorError:
            self._resend()
            return
        except ray.exceptions.RayTaskError as exc:
            self._done()
            if isinstance(exc.cause, ReplayBufferError):
                raise exc.cause from None
            raise
        if written == MISSING:  # the shard does not see this writer's files: rows through Ray from now on
            self.local[self.in_flight[0][1]] = False
            self._resend()
            return
        self._done()

    def _resend(self) -> None:
        """Send every batch in flight again, in order, once the oldest is stored (see :meth:`_settle`)."""
        old = list(self.in_flight)
        self.in_flight.clear()
        while True:
            old = [self._as_rows(entry) for entry in old]
            if self.remote.retry("writer batch", functools.partial(self._submit, old[0])) != MISSING:
                break
            self.local[old[0][1]] = False  # restarted where the files are not
        self.in_flight.extend((self._submit(entry), *entry[1:]) for entry in old[1:])
        if old[0][5] is not None:
            self.spare.append(old[0][5])

    def _as_rows(self, entry: tuple[Any, int, int, Any, Any, _Columns | None]) -> tuple[Any, ...]:
        """``entry`` with its rows instead of a descriptor when its shard no longer sees this writer's files."""
        payload, columns = entry[3], entry[5]
        if isinstance(payload, SharedRows) and columns is not None and not self.local[entry[1]]:
            return (*entry[:3], columns.rows(payload.rows), *entry[4:])
        return entry

    def flush(self) -> None:
        """Send what is pending and wait until every batch is stored."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        self._send()
        while self.in_flight:
            self._settle()

    def close(self) -> None:
        """:meth:`flush`, then let the shards drop their mappings of this writer's files and remove them.
        The writer stays usable, its later batches through Ray."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        try:
            self._flush()
        finally:
            if self._finalizer is not None:
                ray = _ray()
                shards = [s for s, local in zip(self.remote.shards, self.local, strict=True) if local]
                with contextlib.suppress(ray.exceptions.RayError):  # a dead shard holds no mapping
                    ray.get([s.release.remote(self.writer_id) for s in shards])
                self._finalizer()
                self._finalizer, self.folder = None, None
                self.batch, self.spare, self.write_row, self.filled = None, [], _declined, 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
