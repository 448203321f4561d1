"""How a :class:`~.remote.RemoteBuffer` sample is drawn over its shards: which rows each shard ships, and how
the handle makes one batch of them with the probabilities of one big buffer.

The rule. Shard ``i`` holds mass ``m_i`` (rows; prioritized: ``sum (p + eps) ** alpha``). One big buffer draws
each row of a batch of ``B`` from shard ``i`` with probability ``m_i / sum(m)``, so the rows a batch takes from
each shard follow ``Multinomial(B, m / sum(m))``, and those of shard ``i`` are ``k_i`` independent draws by its
own rule. A shard's draw (:meth:`.shard.Shard.sample`) is ``r`` rows drawn independently with replacement and
its mass; the handle draws the split ``k`` from the masses of this very round trip and keeps the first ``k_i``
rows of shard ``i``: how many rows a shard was asked for never biases which rows are kept.

What crosses the wire (the protocol). Asking every shard for ``B`` rows ships ``S * B`` rows to keep ``B``
(2 shards of Atari frames: 28.9 MB a sample(256) to keep 14.4 MB). Here shard ``i`` is asked for
``r_i = min(B, ceil(B p_i + MARGIN_SIGMAS * sqrt(B p_i (1 - p_i))) + 1)`` rows, ``p_i`` its share of the
masses the handle saw last (``1 / S`` at first): ``k_i`` exceeds ``r_i`` with a probability of ~0.1% per
shard (3 standard deviations of the binomial), and then the ``k_i - r_i`` missing rows are drawn by one more
call to that shard (:meth:`Sampler.combine`'s ``top_up``): still independent draws of that shard's rule, so the
probabilities stay exact. One round trip, ``B + ~3 sqrt(B) S`` rows shipped (2 shards, ``B = 256``: ~306
rows, 1.2x what is kept, against 2x), and each shard gathers only the rows it ships.

Why this protocol, measured on a simulated 3-node cluster (``benchmarks/distributed_bench.py --cluster
--sections protocols``: 2 shards on worker nodes of their own, the learner on the head, ``sample(256)`` p50 /
p99 in ms and MB shipped; a 2-core machine, so every "node" shares the cores; docs/performance.md):

===============================================  =====================  ==================
protocol                                         small rows (4 floats)  Atari rows (56 KB)
===============================================  =====================  ==================
every shard ships ``B`` rows (the old rule)      1.34 / 2.13, 0.032     67.6 / 113, 28.9
likely share + 3 sd, topped up (this module)     1.36 / 4.34, 0.019     38.6 / 48, 17.3
two calls: masses, then exactly ``k_i`` rows     2.36 / 3.83, 0.016     34.7 / 47, 14.5
one call of ``1 + C`` returns, kept chunks only  1.73 / 4.52, 0.018     69.6 / 91, 15.5
===============================================  =====================  ==================

Two calls ship the fewest bytes, ~10% faster with Atari frames here, but pay a second round trip on every
sample (1.7x the time with small rows). One call returning the masses and then the rows in ``C`` chunks (the
handle fetching only the chunks that hold its rows; Ray leaves a large object in the shard node's store until
fetched) saves the transfer but not the work: every shard still gathers and stores all ``B`` rows, as slow as
the old rule with frames. The margin keeps one round trip and ships ~1.2x the kept rows; margins of 0-2 sd
measured within the noise of 3 sd with frames (more top-ups, fewer bytes).

:class:`Traffic` counts what crossed (rows and bytes shipped against rows kept, top-up calls).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.core.keys import INDEX_KEY, WEIGHT_KEY
from objectrl_buffer.core.schema import Key
from objectrl_buffer.distributed.admission import Asked
from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.distributed.wire import RAW_WEIGHT, unpack
from objectrl_buffer.errors import EmptyBufferError, ReplayBufferError
from objectrl_buffer.storage.table import make_tensordict

__all__ = ["MARGIN_SIGMAS", "Draw", "Sampler", "Traffic", "get_all", "rows_to_ask"]

#: Standard deviations of a shard's binomial share of a batch added to the rows it is asked for.
MARGIN_SIGMAS = 3.0


@dataclass
class Traffic:
    """What the samples of one handle shipped: ``samples`` combined, ``rows_kept`` (their rows),
    ``rows_shipped`` and ``bytes_shipped`` (by every shard, top-ups included), ``top_ups`` (second calls made
    because a shard's share of a batch exceeded the rows it was asked for)."""

    samples: int = 0
    rows_kept: int = 0
    rows_shipped: int = 0
    bytes_shipped: int = 0
    top_ups: int = 0


def rows_to_ask(batch_size: int, shares: Sequence[float], sigmas: float) -> list[int]:
    """The rows each shard is asked for, given its expected share of the batch and the margin in standard
    deviations of its binomial share (see the module docs)."""
    out = []
    for p in shares:
        p = min(max(float(p), 0.0), 1.0)
        spread = sigmas * math.sqrt(batch_size * p * (1.0 - p))
        out.append(max(1, min(batch_size, math.ceil(batch_size * p + spread) + 1)))
    return out


class Draw:
    """One sample on its way (:meth:`RemoteBuffer.submit_sample <.remote.RemoteBuffer.submit_sample>`): the shards
    asked (``shards``) and the rows each is asked for (``asks``), its admission (``asked``; ``None`` without a
    limiter), the shards' draw refs once sent (``refs``), and a refusal met early (``error``)."""

    def __init__(self, batch_size: int, asks: list[int], shards: list[int]) -> None:
        self.batch_size = batch_size
        self.asks, self.shards = asks, shards
        self.asked: Asked | None = None
        self.refs: list[Any] | None = None
        self.error: ReplayBufferError | None = None


class Sampler:
    """A handle's side of sampling: the shares it expects of each shard, its generator (the split), the
    :class:`Traffic` counters, and how packed draws become one batch.

    Args:
        num_shards: shards of the buffer; capacity: rows per shard (a global index is ``shard * capacity +
        slot``); beta: the importance exponent of a prioritized buffer (``None``: no weights).
    """

    def __init__(self, num_shards: int, capacity: int, beta: float | None, generator: torch.Generator) -> None:
        self.capacity, self.beta, self.generator = capacity, beta, generator
        self.shares = [1.0 / num_shards] * num_shards
        self.traffic = Traffic()
        #: the margin in standard deviations (``None``: :data:`MARGIN_SIGMAS`)
        self.margin: float | None = None

    def asks(self, batch_size: int, shards: Sequence[int] | None = None) -> list[int]:
        """Rows to ask of each of ``shards`` (all by default) for a batch of ``batch_size``."""
        numbers = range(len(self.shares)) if shards is None else shards
        shares = [self.shares[i] for i in numbers]
        total = sum(shares)
        sigmas = MARGIN_SIGMAS if self.margin is None else self.margin
        return rows_to_ask(batch_size, [s / total if total > 0 else 1.0 / len(shares) for s in shares], sigmas)

    def combine(
        self,
        batch_size: int,
        got: list[bytes],
        top_up: Callable[[list[tuple[int, int]]], list[bytes]],
        shards: Sequence[int] | None = None,
    ) -> TensorDict:
        """One batch of ``batch_size`` rows from the packed draws ``got`` of ``shards`` (all, in order, by
        default); ``top_up([(shard, n), ...])``: ``n`` more rows of each shard named, packed, all in one round
        trip (see the module docs).

        Returns:
            A TensorDict ``[batch_size]`` on the CPU: the stored keys, global ``"index"``, ``"generation"``
            and, prioritized, ``"weight"`` over the whole batch.

        Raises:
            EmptyBufferError: no shard holds a row, or a shard emptied before its top-up.
        """
        numbers = list(range(len(got))) if shards is None else list(shards)
        traffic = self.traffic
        traffic.samples += 1
        traffic.bytes_shipped += sum(len(packed) for packed in got)
        draws = [unpack(packed, copy=len(got) == 1) for packed in got]  # one draw: views of a writable copy
        traffic.rows_shipped += sum(rows for _, rows, _ in draws)
        masses = [mass for mass, _, _ in draws]
        total = sum(masses)
        if not total > 0:
            raise EmptyBufferError("no shard holds a row to sample")
        if len(got) == 1:
            counts = np.array([batch_size])
        else:
            for i, mass in zip(numbers, masses, strict=True):
                self.shares[i] = mass / total
            weights = torch.tensor(masses, dtype=torch.float64)
            picks = torch.multinomial(weights, batch_size, replacement=True, generator=self.generator)
            counts = np.bincount(picks.numpy(), minlength=len(got))
        which = np.flatnonzero(counts).tolist()
        short = [(numbers[j], int(counts[j]) - draws[j][1]) for j in which if counts[j] > draws[j][1]]
        extra = dict(zip([j for j in which if counts[j] > draws[j][1]], self._top_up(top_up, short), strict=True))
        if len(got) == 1 and not extra:  # the whole draw: views of one writable copy of its bytes
            out = {key: value[:batch_size] for key, value in draws[0][2].items()}
        else:  # np.concatenate copies the kept rows out of the shipped bytes
            parts = []
            for j in which:
                parts.append({key: value[: counts[j]] for key, value in draws[j][2].items()})
                if j in extra:
                    parts.append(extra[j])
            out = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        offsets = np.repeat(np.array([numbers[j] for j in which], dtype=np.int64) * self.capacity, counts[which])
        out[INDEX_KEY] = out[INDEX_KEY] + offsets
        traffic.rows_kept += batch_size
        return self.to_batch(out, batch_size)

    def _top_up(
        self, top_up: Callable[[list[tuple[int, int]]], list[bytes]], short: list[tuple[int, int]]
    ) -> list[dict[str, np.ndarray]]:
        if not short:
            return []
        got = top_up(short)
        self.traffic.top_ups += 1
        self.traffic.bytes_shipped += sum(len(packed) for packed in got)
        out = []
        for packed, (_, n) in zip(got, short, strict=True):
            _, rows, columns = unpack(packed, copy=False)
            self.traffic.rows_shipped += rows
            if rows < n:
                raise EmptyBufferError("a shard emptied while its rows were being sampled")
            out.append(columns)
        return out

    def to_batch(self, out: dict[str, np.ndarray], batch_size: int) -> TensorDict:
        """The TensorDict of flat NumPy columns ``out`` (nested keys joined by ``"."``; a prioritized shard's raw
        weights become ``"weight"`` over the whole batch, as one buffer's)."""
        values: dict[Key, torch.Tensor] = {}
        nested = False
        for key, value in out.items():
            if key == RAW_WEIGHT:
                if self.beta is not None:
                    raw = torch.from_numpy(value)
                    values[WEIGHT_KEY] = (raw / raw.min()).pow(-self.beta).to(torch.float32)
            elif "." in key:  # a nested key, flattened for the trip
                values[tuple(key.split("."))] = torch.from_numpy(value)
                nested = True
            else:
                values[key] = torch.from_numpy(value)
        return make_tensordict(values, torch.Size([batch_size]), None, nested)


def get_all(refs: list[Any]) -> list[Any]:
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
