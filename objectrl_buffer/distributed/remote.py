"""A buffer served by Ray actors (the ``ray`` extra): one actor per shard, a handle with the buffer's methods.

``RemoteBuffer.launch(buffer_cls, *args, num_shards=..., **kwargs)`` starts ``num_shards`` actors, each
holding ``buffer_cls(*args, **kwargs)``. Payloads travel as NumPy arrays (Ray's zero-copy path; torch tensors
are pickled copies, 10-40x slower); Ray carries the calls.

* Writes go to the shards in turn (``add``, ``add_batch``); :meth:`RemoteBuffer.writer` batches single adds
  client-side with at most ``max_in_flight`` batches on their way.
* :meth:`RemoteBuffer.sample_batch` splits a batch over the shards by a multinomial draw proportional to their
  sizes (prioritized: to their priority mass ``sum (p + eps) ** alpha``), then each shard draws by its own
  rule: every row has the probability it would have in one big buffer. Importance weights are recomputed
  over the whole batch. ``"index"`` is global (``shard * capacity + slot``); ``"generation"`` says which
  write of that slot was drawn.
* :meth:`RemoteBuffer.update_priority` ignores updates to slots rewritten since they were sampled (given the
  batch's ``"generation"``) and returns how many it applied.
* :meth:`RemoteBuffer.prefetch` keeps ``depth`` samples in flight. A handle pickles into Ray tasks and actors.

Not built yet: checkpoints of the shards together, restart from them and exactly-once retried writes
(``checkpoint_path``/``checkpoint_every_s`` are refused), and one rate limiter for all shards.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.core.keys import INDEX_KEY, WEIGHT_KEY
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError

__all__ = ["RemoteBuffer", "Shard", "Writer", "GENERATION_KEY"]

#: The key of a remote sample saying which write of each slot was drawn.
GENERATION_KEY = "generation"
_RAW_WEIGHT = "_raw_weight"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "objectrl_buffer.distributed.RemoteBuffer needs Ray: pip install 'objectrl_buffer[ray]'"
        ) from None
    return ray


def to_numpy(data: TensorDictBase | Mapping[str, Any]) -> dict[str, Any]:
    """A write as flat ``{key: NumPy array or number}`` (nested keys joined by ``"."``)."""
    items = data.items(include_nested=True, leaves_only=True) if isinstance(data, TensorDictBase) else data.items()
    out = {}
    for key, value in items:
        name = ".".join(key) if isinstance(key, tuple) else key
        out[name] = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
    return out


def _from_numpy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in data.items()}


def _priorities(buffer: Any) -> Any:
    """The prioritized extra state of a buffer (its public ``checkpoint_extras``), or ``None``."""
    return next((e for e in getattr(buffer, "checkpoint_extras", ()) if getattr(e, "name", "") == "prioritized"), None)


class Shard:
    """What one Ray actor runs: a buffer plus the write generation of each slot (for stale updates)."""

    def __init__(self, buffer_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.buffer = buffer_cls(*args, **kwargs)
        self.capacity = int(self.buffer.buffer_size)
        self.written = 0
        self.generation = np.full(self.capacity, -1, dtype=np.int64)

    def _wrote(self, pointer: int, n: int) -> int:
        keep = min(n, self.capacity)
        seqs = np.arange(self.written + n - keep, self.written + n, dtype=np.int64)
        self.generation[(pointer + n - keep + np.arange(keep)) % self.capacity] = seqs
        self.written += n
        return len(self.buffer)

    def add(self, transition: Mapping[str, Any]) -> int:
        pointer = int(self.buffer.pointer)
        self.buffer.add(_from_numpy(transition))
        return self._wrote(pointer, int(self.buffer.num_envs))

    def add_batch(self, batch: Mapping[str, Any]) -> int:
        pointer = int(self.buffer.pointer)
        converted = _from_numpy(batch)
        self.buffer.add_batch(converted)
        first: Any = next(iter(converted.values()), None)
        envs = int(self.buffer.num_envs)
        n = len(first) * (envs if envs > 1 else 1) if hasattr(first, "__len__") else 0
        return self._wrote(pointer, n)

    def stats(self) -> tuple[int, float]:
        """``(rows, mass)``: mass is the priority mass of a prioritized buffer, else the row count."""
        priorities = _priorities(self.buffer)
        size = len(self.buffer)
        return size, float(priorities.index.total()) if priorities is not None and size else float(size)

    def sample(self, k: int) -> dict[str, np.ndarray]:
        batch = self.buffer.sample_batch(k)
        out = to_numpy(batch)
        slots = batch[INDEX_KEY]
        out[GENERATION_KEY] = self.generation[slots.numpy()]
        priorities = _priorities(self.buffer)
        if priorities is not None:
            raw = (priorities.priority.index_select(0, slots) + priorities.eps).pow(priorities.alpha)
            out[_RAW_WEIGHT] = raw.numpy()
        return out

    def update_priority(self, slots: np.ndarray, priority: np.ndarray, generation: np.ndarray | None) -> int:
        keep = np.ones(len(slots), dtype=bool) if generation is None else self.generation[slots] == generation
        if keep.any():
            self.buffer.update_priority(torch.from_numpy(slots[keep]), torch.from_numpy(priority[keep]))
        return int(keep.sum())

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.buffer, name)(*args, **kwargs)

    def get(self, name: str) -> Any:
        return getattr(self.buffer, name)


class RemoteBuffer:
    """A handle on shard actors (see the module docs). Build it with :meth:`launch`."""

    def __init__(self, shards: list[Any], capacity: int, beta: float | None, seed: int | None = None) -> None:
        self.shards, self.capacity, self.beta = shards, capacity, beta
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._turn = 0

    @classmethod
    def launch(
        cls,
        buffer_cls: type,
        *args: Any,
        num_shards: int = 1,
        checkpoint_path: str | None = None,
        checkpoint_every_s: float | None = None,
        actor_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> RemoteBuffer:
        """Start ``num_shards`` actors holding ``buffer_cls(*args, **kwargs)`` each (``seed`` differs per shard).

        Raises:
            ImportError: Ray is not installed. InvalidArgumentError: a bad ``num_shards``; checkpointing
                is asked for (not built yet).
        """
        ray = _ray()
        n = positive_int(num_shards, "num_shards")
        if checkpoint_path is not None or checkpoint_every_s is not None:
            raise InvalidArgumentError("checkpoint_path/checkpoint_every_s: shard checkpoints are not built yet")
        actor = ray.remote(Shard).options(**dict(actor_options or {"num_cpus": 0}))
        seed = kwargs.pop("seed", None)
        shards = []
        for i in range(n):
            shard_kwargs = dict(kwargs, seed=None if seed is None else seed + i)
            shards.append(actor.remote(buffer_cls, args, shard_kwargs))
        capacity = int(ray.get(shards[0].get.remote("buffer_size")))
        beta = ray.get(shards[0].get.remote("beta")) if hasattr(buffer_cls, "update_priority") else None
        return cls(shards, capacity, beta, seed)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteBuffer, (self.shards, self.capacity, self.beta))

    # ------------------------------------------------------------------ writes
    def next_shard(self) -> Any:
        """The shard the next write goes to (the shards take writes in turn)."""
        shard = self.shards[self._turn % len(self.shards)]
        self._turn += 1
        return shard

    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> None:
        """The shards' ``add``, in turn (blocking)."""
        _ray().get(self.next_shard().add.remote(to_numpy(transition)))

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> None:
        """The shards' ``add_batch``, in turn: the whole batch to one shard (blocking)."""
        _ray().get(self.next_shard().add_batch.remote(to_numpy(batch)))

    def writer(self, batch_size: int = 256, flush_every_s: float = 0.1, max_in_flight: int = 2) -> Writer:
        """A client-side batcher of single adds (see :class:`Writer`)."""
        return Writer(self, batch_size, flush_every_s, max_in_flight)

    # ------------------------------------------------------------------ reads
    def stats(self) -> list[tuple[int, float]]:
        """``(rows, mass)`` of each shard."""
        ray = _ray()
        return list(ray.get([s.stats.remote() for s in self.shards]))

    def __len__(self) -> int:
        return sum(rows for rows, _ in self.stats())

    def sample_batch(self, batch_size: int) -> TensorDict:
        """``batch_size`` rows over all shards with one big buffer's probabilities (see the module docs).

        Raises:
            EmptyBufferError: no shard holds a row.
        """
        ray = _ray()
        k = positive_int(batch_size, "batch_size")
        masses = torch.tensor([mass for _, mass in self.stats()], dtype=torch.float64)
        if not masses.sum() > 0:
            raise EmptyBufferError("no shard holds a row to sample")
        picks = torch.multinomial(masses, k, replacement=True, generator=self.generator)
        counts = torch.bincount(picks, minlength=len(self.shards)).tolist()
        which = [i for i, c in enumerate(counts) if c]
        parts = ray.get([self.shards[i].sample.remote(counts[i]) for i in which])
        out: dict[str, torch.Tensor] = {}
        for key in parts[0]:
            out[key] = torch.from_numpy(np.concatenate([p[key] for p in parts]))
        out[INDEX_KEY] = torch.from_numpy(
            np.concatenate([p[INDEX_KEY] + i * self.capacity for i, p in zip(which, parts, strict=True)])
        )
        raw = out.pop(_RAW_WEIGHT, None)
        if raw is not None and self.beta is not None:  # weights over the whole batch, as one buffer's
            out[WEIGHT_KEY] = (raw / raw.min()).pow(-self.beta).to(torch.float32)
        return TensorDict(out, batch_size=[k]).unflatten_keys(".")

    def prefetch(self, batch_size: int, depth: int = 2) -> Iterator[TensorDict]:
        """An endless iterator of samples with ``depth`` of them in flight (drawn in a helper thread)."""
        depth = positive_int(depth, "depth")
        with ThreadPoolExecutor(max_workers=1) as pool:
            queue: deque[Future[TensorDict]] = deque(pool.submit(self.sample_batch, batch_size) for _ in range(depth))
            try:
                while True:
                    batch = queue.popleft().result()
                    queue.append(pool.submit(self.sample_batch, batch_size))
                    yield batch
            finally:
                for future in queue:
                    future.cancel()

    def update_priority(self, index: Any, priority: Any, generation: Any = None) -> int:
        """Set priorities at global ``index`` (a sample's ``"index"``); with the sample's ``"generation"``,
        slots rewritten since are skipped. Returns how many were applied."""
        ray = _ray()
        slots = torch.as_tensor(index).reshape(-1).numpy().astype(np.int64)
        values = torch.as_tensor(priority, dtype=torch.float64).reshape(-1).numpy()
        gens = None if generation is None else torch.as_tensor(generation).reshape(-1).numpy().astype(np.int64)
        if len(values) != len(slots) or (gens is not None and len(gens) != len(slots)):
            raise InvalidArgumentError("update_priority: index, priority and generation must have one value per row")
        shard_of = slots // self.capacity
        refs = []
        for i in np.unique(shard_of):
            if not 0 <= i < len(self.shards):
                raise InvalidArgumentError(f"update_priority: index {int(slots[shard_of == i][0])} names no shard")
            mask = shard_of == i
            refs.append(
                self.shards[i].update_priority.remote(
                    slots[mask] % self.capacity, values[mask], None if gens is None else gens[mask]
                )
            )
        return int(sum(ray.get(refs)))

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``buffer.<name>(*args, **kwargs)`` on every shard; their results."""
        ray = _ray()
        return list(ray.get([s.call.remote(name, *args, **kwargs) for s in self.shards]))

    def kill(self) -> None:
        """Stop the shard actors."""
        ray = _ray()
        for shard in self.shards:
            ray.kill(shard)


class Writer:
    """Batches single ``add`` s client-side into ``add_batch`` calls of ``batch_size`` rows (or whatever is
    pending after ``flush_every_s``), with at most ``max_in_flight`` batches unacknowledged. Use as a context
    manager or call :meth:`flush`."""

    def __init__(self, remote: RemoteBuffer, batch_size: int, flush_every_s: float, max_in_flight: int) -> None:
        self.remote = remote
        self.batch_size = positive_int(batch_size, "batch_size")
        self.flush_every_s = float(flush_every_s)
        self.max_in_flight = positive_int(max_in_flight, "max_in_flight")
        self.pending: list[dict[str, Any]] = []
        self.in_flight: deque[Any] = deque()
        self.since = time.monotonic()

    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> None:
        self.pending.append(to_numpy(transition))
        if len(self.pending) >= self.batch_size or time.monotonic() - self.since >= self.flush_every_s:
            self._send()

    def _send(self) -> None:
        self.since = time.monotonic()
        if not self.pending:
            return
        batch = {key: np.stack([np.asarray(row[key]) for row in self.pending]) for key in self.pending[0]}
        self.pending = []
        ray = _ray()
        while len(self.in_flight) >= self.max_in_flight:
            ray.get(self.in_flight.popleft())  # bounded: no refs pile up
        self.in_flight.append(self.remote.next_shard().add_batch.remote(batch))

    def flush(self) -> None:
        """Send what is pending and wait until every batch is stored."""
        self._send()
        ray = _ray()
        while self.in_flight:
            ray.get(self.in_flight.popleft())

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
