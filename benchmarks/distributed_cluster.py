"""The Ray buffer across nodes: a simulated cluster (``ray.cluster_utils.Cluster``, a head and 3 worker nodes on
this machine), RemoteBuffer beside torchrl's ``RayReplayBuffer`` (``distributed_bench.py --cluster``).

    PYTHONPATH=. .venv/bin/python benchmarks/distributed_bench.py --cluster [--quick] [--sections ...]

Placement: each shard on a worker node of its own (every worker node offers one shard slot, a custom resource),
writers on a worker node without a shard, the learner in the driver (the head node); torchrl's buffer actor on
shard 0's node. Sections:

* ``inserts``: one writer actor's ``add_batch`` (blocking), ``writer().add_batch`` (pipelined) and torchrl's
  ``extend``, rows/s, of small rows (obs 4 float32) and Atari frames (obs, next_obs 4x84x84 uint8);
* ``samples``: the learner's ``sample_batch(256)`` p50/p99 and bytes shipped a sample, 1 and 2 shards, beside
  torchrl's ``sample(256)``;
* ``protocols``: how a 2-shard sample ships its rows (objectrl_buffer/distributed/draws.py): every shard its
  whole batch (the old rule), the likely share plus a margin (the rule now), two calls (masses, then exactly
  the rows kept), and one call of 1 + C returns fetching only the chunks that hold the kept rows;
* ``stall``: a shard's node hard-killed (``remove_node(node, allow_graceful=False)``) while a writer actor writes
  and the learner samples: the longest time nothing was stored (sampled), with Ray's default health checks and
  tuned ones (:data:`TUNED`), for each ``shard_loss`` mode ``RemoteBuffer.launch`` has.

The ratios are speeds, ours over torchrl's (above 1: ours faster). One run on a shared 2-core machine: every
"node" competes for the same cores, and no byte crosses a real network; compare numbers of one run only.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import math
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch

#: Ray's health checks tuned to notice a dead node in ~1.5 s (Ray's defaults: a check every 3 s, 10 s
#: timeout, 5 failures in a row: 15-30 s).
TUNED = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
SLOT = "shard_slot"  # the custom resource of a worker node: one shard a node
BATCH = 256
SECTIONS = ("inserts", "samples", "protocols", "stall")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--cluster (a simulated 3-node Ray cluster)")
    group.add_argument("--cluster", action="store_true", help="run the multi-node sections below instead")
    group.add_argument("--quick", action="store_true", help="small sizes, tuned health checks only (< 2 minutes)")
    group.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    group.add_argument("--kinds", default="small,atari", help="row kinds: small, atari")
    group.add_argument("--shards", default="1,2", help="shard counts of the inserts and samples sections")
    group.add_argument("--samples", type=int, default=300, help="sample(256) calls timed (after a warm-up)")
    group.add_argument("--insert-batches", type=int, default=200, help="batches a writer sends, small rows")
    group.add_argument("--atari-batches", type=int, default=60, help="batches a writer sends, Atari rows")
    group.add_argument("--atari-batch", type=int, default=64, help="rows in an Atari insert batch")
    group.add_argument("--margins", default="", help="protocols: margins (sd) to measure beside the default")
    group.add_argument("--health", default="default,tuned", help="health checks of the stall section")
    group.add_argument("--stall-s", type=float, default=40.0, help="seconds observed after the kill (tuned: / 4)")


def quick(args: argparse.Namespace) -> None:
    """Small sizes for ``--quick``: a few seconds a section."""
    args.samples = min(args.samples, 40)
    args.insert_batches = min(args.insert_batches, 30)
    args.atari_batches = min(args.atari_batches, 8)
    args.health = "tuned"
    args.stall_s = min(args.stall_s, 24.0)


# ------------------------------------------------------------------------------------------ rows
def small(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 4), dtype=np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, 2, n),
        "reward": np.ones(n, np.float32),
        "next_obs": obs + 0.1,
        "done": np.zeros(n, bool),
    }


def atari(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)
    return {
        "obs": obs,
        "action": rng.integers(0, 6, n),
        "reward": np.ones(n, np.float32),
        "next_obs": np.roll(obs, 1, axis=1),
        "done": np.zeros(n, bool),
    }


KINDS: dict[str, Callable[..., dict[str, np.ndarray]]] = {"small": small, "atari": atari}


def as_td(data: dict[str, np.ndarray]) -> Any:
    from tensordict import TensorDict

    return TensorDict({k: torch.from_numpy(v) for k, v in data.items()}, [len(data["obs"])])


# ------------------------------------------------------------------------------------------ the cluster
@contextmanager
def cluster(tuned: bool, store_mb: int) -> Iterator[Any]:
    """A head (the driver: the learner) and 3 worker nodes offering one shard slot each; shut down on exit."""
    import ray
    from ray.cluster_utils import Cluster

    # a temp dir of its own: Ray's default one would record this cluster as "the current one", and a plain
    # ray.init() elsewhere on the machine would join it instead of starting its own
    head = {
        "num_cpus": 1,
        "include_dashboard": False,
        "object_store_memory": store_mb << 20,
        "temp_dir": tempfile.mkdtemp(prefix="ray-cluster-"),
    }
    if tuned:
        head["_system_config"] = dict(TUNED)
    c = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(3):
            add_worker(c, store_mb)
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def add_worker(c: Any, store_mb: int) -> Any:
    return c.add_node(num_cpus=1, resources={SLOT: 1}, object_store_memory=store_mb << 20)


def pinned(node_id: str) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def workers(c: Any) -> list[str]:
    return [n.node_id for n in c.worker_nodes]


def launch(shards: int, capacity: int, tmp: str, **extra: Any) -> Any:
    """A RemoteBuffer of ``shards`` plain buffers, one a worker node (its slot)."""
    from objectrl_buffer import ReplayBuffer
    from objectrl_buffer.distributed import RemoteBuffer

    options = {"num_cpus": 0, "resources": {SLOT: 1}}
    return RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", capacity, num_shards=shards, seed=0, storage_dir=tmp, actor_options=options, **extra
    )


class WriterActor:
    """A writer on a node without a shard: timed inserts through our handle or torchrl's client."""

    def blocking(self, handle: Any, data: dict[str, np.ndarray], n: int) -> float:
        handle.add_batch(data)  # warm
        start = time.perf_counter()
        for _ in range(n):
            handle.add_batch(data)
        return n * len(data["obs"]) / (time.perf_counter() - start)

    def pipelined(self, handle: Any, data: dict[str, np.ndarray], n: int) -> float:
        start = time.perf_counter()
        with handle.writer(batch_size=len(data["obs"]), max_in_flight=4) as writer:
            for _ in range(n):
                writer.add_batch(data)
        return n * len(data["obs"]) / (time.perf_counter() - start)  # until the last batch is stored

    def torchrl(self, client: Any, td: Any, n: int) -> float:
        client.extend(td)  # warm
        start = time.perf_counter()
        for _ in range(n):
            client.extend(td)
        return n * len(td) / (time.perf_counter() - start)

    def loop(
        self, handle: Any, data: dict[str, np.ndarray], until: float, batched: bool = False
    ) -> tuple[list[float], list[str]]:
        """``add_batch`` until wall-clock time ``until`` (``batched``: a ``Writer``'s, else the handle's blocking
        one): when each call returned, and the errors met."""
        done, errors = [], []
        target = handle.writer(batch_size=len(data["obs"])) if batched else handle
        while time.time() < until:
            try:
                target.add_batch(data)
                done.append(time.time())
            except Exception as exc:  # BufferUnavailable: reported, and writing goes on
                errors.append(type(exc).__name__)
        if batched:
            with contextlib.suppress(Exception):
                target.close()
        return done, errors


def timed(call: Callable[[], Any], n: int) -> tuple[float, float]:
    """p50 and p99 of ``call()`` in ms, after one untimed call."""
    call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return 1000 * statistics.median(times), 1000 * times[min(n - 1, math.ceil(0.99 * n) - 1)]


def td_bytes(td: Any) -> int:
    return sum(v.numel() * v.element_size() for v in td.values(include_nested=True, leaves_only=True))


# ------------------------------------------------------------------------------------------ sections
def run(args: argparse.Namespace) -> list[str]:
    """The sections asked for; Markdown lines."""
    if args.quick:
        quick(args)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"--sections: unknown {unknown} (of {SECTIONS})")
    kinds = [k for k in args.kinds.split(",") if k]
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    lines: list[str] = []
    started = time.perf_counter()
    if {"inserts", "samples", "protocols"} & set(sections):
        with cluster(tuned=False, store_mb=1024) as c, tempfile.TemporaryDirectory() as tmp:
            lines += throughput(c, args, sections, kinds, shard_counts, tmp)
    if "stall" in sections:
        lines += stall_section(args)
    lines.append(f"\n({time.perf_counter() - started:.0f} s in all)")
    return lines


def throughput(
    c: Any, args: argparse.Namespace, sections: list[str], kinds: list[str], shard_counts: list[int], tmp: str
) -> list[str]:
    import ray
    from torchrl.data import LazyTensorStorage
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    nodes = workers(c)
    margins = [float(m) for m in args.margins.split(",") if m]
    lines = [
        "| measure | objectrl_buffer | torchrl RayReplayBuffer | speed ours/torchrl |",
        "| --- | --- | --- | --- |",
    ]
    protocol_lines: list[str] = []

    def row(name: str, ours: float, theirs: float, higher_is_faster: bool, fmt: str = "{:,.0f}") -> None:
        ratio = ours / theirs if higher_is_faster else theirs / ours
        lines.append(f"| {name} | {fmt.format(ours)} | {fmt.format(theirs)} | {ratio:.2f}x |")

    for kind in kinds:
        make = KINDS[kind]
        per_batch = BATCH if kind == "small" else args.atari_batch
        batches = args.insert_batches if kind == "small" else args.atari_batches
        capacity = (200_000 if kind == "small" else 4096) // (4 if args.quick else 1)
        data = make(per_batch)
        # torchrl's buffer on the first worker node; its writer on the last
        peer = RayReplayBuffer(
            storage=partial(LazyTensorStorage, capacity), batch_size=BATCH, remote_config=pinned(nodes[0])
        )
        writer = ray.remote(WriterActor).options(**pinned(nodes[-1])).remote()
        fill = max(1, -(-capacity // per_batch) // (8 if kind == "small" else 2))  # rows to sample from
        peer_insert = 0.0
        if "inserts" in sections:
            peer_insert = ray.get(writer.torchrl.remote(peer.client(), as_td(data), batches))
        ray.kill(writer)
        for _ in range(fill):
            peer.extend(as_td(data))
        peer_p50, peer_p99 = timed(partial(peer.sample, BATCH), args.samples)
        peer_bytes = td_bytes(peer.sample(BATCH))
        for shards in shard_counts:
            handle = launch(shards, capacity, tmp)
            placed = handle.node_ids()
            free = [n for n in nodes if n not in placed]
            writer = ray.remote(WriterActor).options(**pinned(free[-1])).remote()
            what = f"{kind} rows, {shards} shard{'s' if shards > 1 else ''}"
            if "inserts" in sections:
                rate = ray.get(writer.blocking.remote(handle, data, batches))
                row(f"{what}: add_batch({per_batch}) from a writer node, rows/s", rate, peer_insert, True)
                rate = ray.get(writer.pipelined.remote(handle, data, batches))
                row(f"{what}: writer().add_batch({per_batch}) pipelined, rows/s", rate, peer_insert, True)
            for _ in range(fill):
                handle.add_batch(data)
            if "samples" in sections:
                traffic = handle.sampler.traffic
                before = (traffic.bytes_shipped, traffic.samples)
                p50, p99 = timed(partial(handle.sample_batch, BATCH), args.samples)
                sent = (traffic.bytes_shipped - before[0]) / max(1, traffic.samples - before[1])
                row(f"{what}: sample_batch(256) p50, ms", p50, peer_p50, False, "{:,.2f}")
                row(f"{what}: sample_batch(256) p99, ms", p99, peer_p99, False, "{:,.2f}")
                row(f"{what}: MB shipped a sample(256)", sent / 1e6, peer_bytes / 1e6, False, "{:,.2f}")
            if "protocols" in sections and shards == 2:
                protocol_lines += protocols(handle, kind, data, fill, args.samples, tmp, margins)
            handle.kill(close_timeout_s=10)
            ray.kill(writer)
        peer.close()
    return [*lines, *protocol_lines] if len(lines) > 2 else protocol_lines


# ------------------------------------------------------------------------------------------ protocols
class ChunkShard:
    """The one-call alternative of ``draws.py``: a draw as ``1 + C`` objects (the mass, then the rows in ``C``
    chunks split at ``bounds``) so that the handle fetches only the chunks holding the rows it keeps."""

    def __init__(self, data: dict[str, np.ndarray], batches: int, capacity: int, tmp: str) -> None:
        from objectrl_buffer import ReplayBuffer
        from objectrl_buffer.distributed.shard import Shard

        self.shard = Shard(ReplayBuffer, ("cpu", "cpu", capacity), {"seed": 1, "storage_dir": tmp})
        for _ in range(batches):
            self.shard.add_batch(data)

    def sample(self, k: int, bounds: list[int]) -> tuple[bytes, ...]:
        from objectrl_buffer.core.keys import GENERATION_KEY, INDEX_KEY
        from objectrl_buffer.distributed.wire import pack, to_numpy

        _, mass, _ = self.shard.stats()
        out = to_numpy(self.shard.buffer.sample_batch(k))
        out[GENERATION_KEY] = self.shard.state.generation.take(out[INDEX_KEY])
        edges = [0, *bounds, k]
        return (
            pack(mass, {}),
            *[pack(mass, {c: v[a:b] for c, v in out.items()}) for a, b in itertools.pairwise(edges)],
        )


def split(masses: list[float], generator: torch.Generator) -> np.ndarray:
    picks = torch.multinomial(torch.tensor(masses, dtype=torch.float64), BATCH, replacement=True, generator=generator)
    return np.bincount(picks.numpy(), minlength=len(masses))


def protocols(
    handle: Any, kind: str, data: dict[str, np.ndarray], batches: int, samples: int, tmp: str, margins: list[float]
) -> list[str]:
    """A 2-shard ``sample(256)`` by each protocol: p50/p99 latency and MB shipped a sample."""
    import ray

    from objectrl_buffer.distributed.wire import unpack

    shards, sampler = handle.shards, handle.sampler
    generator = torch.Generator().manual_seed(0)
    shipped: dict[str, list[int]] = {}

    def concat(parts: list[bytes], counts: list[int]) -> Any:
        cols = [unpack(p, copy=False)[2] for p in parts]
        out = {k: np.concatenate([c[k][:n] for c, n in zip(cols, counts, strict=True)]) for k in cols[0]}
        return sampler.to_batch(out, BATCH)

    def whole() -> Any:  # every shard ships the whole batch (the old rule)
        got = ray.get([s.sample.remote(BATCH) for s in shards])
        shipped.setdefault("whole", []).append(sum(map(len, got)))
        return concat(got, split([unpack(g, copy=False)[0] for g in got], generator).tolist())

    def margin(sigmas: float | None) -> Callable[[], Any]:
        def call() -> Any:  # the rule now (draws.py)
            before, sampler.margin = sampler.traffic.bytes_shipped, sigmas
            batch = handle.sample_batch(BATCH)
            shipped.setdefault(f"margin {sigmas}", []).append(sampler.traffic.bytes_shipped - before)
            return batch

        return call

    def two_calls() -> Any:  # masses first, then exactly the rows kept
        masses = [mass for _, mass, _ in ray.get([s.stats.remote() for s in shards])]
        counts = split(masses, generator)
        asked = [i for i in range(len(shards)) if counts[i]]
        got = ray.get([shards[i].sample.remote(int(counts[i])) for i in asked])
        shipped.setdefault("two", []).append(sum(map(len, got)))
        return concat(got, [int(counts[i]) for i in asked])

    chunkers = [
        ray.remote(ChunkShard).options(**pinned(node)).remote(data, batches, batches * len(data["obs"]), tmp)
        for node in handle.node_ids()
    ]
    ray.get([c.sample.remote(1, []) for c in chunkers])
    mean, spread = BATCH / 2, 2 * math.sqrt(BATCH / 4)
    bounds = [int(mean - spread), int(mean), int(mean + spread)]  # 4 chunks around the likely share

    def chunks() -> Any:
        refs = [c.sample.options(num_returns=2 + len(bounds)).remote(BATCH, bounds) for c in chunkers]
        masses = [unpack(m)[0] for m in ray.get([r[0] for r in refs])]
        counts = split(masses, generator).tolist()
        edges = [0, *bounds, BATCH]
        need = [[j for j in range(len(edges) - 1) if edges[j] < n] for n in counts]
        got = ray.get([r[1 + j] for r, js in zip(refs, need, strict=True) for j in js])
        shipped.setdefault("chunks", []).append(sum(map(len, got)))
        parts, at = [], 0
        for js in need:  # each shard's fetched chunks as one pack's columns
            cols = [unpack(g, copy=False)[2] for g in got[at : at + len(js)]]
            at += len(js)
            parts.append({k: np.concatenate([c[k] for c in cols]) for k in cols[0]} if cols else {})
        kept = [(p, n) for p, n in zip(parts, counts, strict=True) if n]
        out = {k: np.concatenate([p[k][:n] for p, n in kept]) for k in kept[0][0]}
        return sampler.to_batch(out, BATCH)

    lines = [
        f"\n| {kind} rows, 2 shards, sample(256) by protocol | p50, ms | p99, ms | MB shipped a sample |",
        "| --- | --- | --- | --- |",
    ]
    ways = [("every shard ships 256 rows (before)", "whole", whole)]
    for sigmas in [None, *margins]:
        what = "the default margin" if sigmas is None else f"a margin of {sigmas:g} sd"
        ways.append((f"its likely share + {what}, topped up if short", f"margin {sigmas}", margin(sigmas)))
    ways += [
        ("two calls: masses, then the rows kept", "two", two_calls),
        ("one call, 1 + 4 returns, kept chunks fetched", "chunks", chunks),
    ]
    for name, key, call in ways:
        top_ups = sampler.traffic.top_ups
        p50, p99 = timed(call, samples)
        if key.startswith("margin"):
            name += f" ({sampler.traffic.top_ups - top_ups} top-ups)"
        lines.append(f"| {name} | {p50:.2f} | {p99:.2f} | {statistics.mean(shipped[key]) / 1e6:.3f} |")
    sampler.margin = None
    for c in chunkers:
        ray.kill(c)
    return lines


# ------------------------------------------------------------------------------------------ stall
def modes() -> list[str]:
    """The ``shard_loss`` modes ``RemoteBuffer.launch`` takes (``"wait"`` only before it had the parameter)."""
    from objectrl_buffer.distributed import RemoteBuffer

    return ["wait", "degrade"] if "shard_loss" in inspect.signature(RemoteBuffer.launch).parameters else ["wait"]


def longest_gap(done: list[float], kill: float, end: float) -> float:
    """The longest time after ``kill`` with no call returning (to ``end`` if none returned since)."""
    before = [t for t in done if t <= kill]
    after = [t for t in done if t > kill]
    edges = [before[-1] if before else kill, *after, end]
    return max(b - a for a, b in itertools.pairwise(edges))


def calls_after(done: list[float], kill: float, end: float) -> list[float]:
    """The calls that returned after the longest gap since ``kill`` (none: nothing flowed again)."""
    gap = longest_gap(done, kill, end)
    before = [t for t in done if t <= kill]
    edges = [before[-1] if before else kill, *[t for t in done if t > kill], end]
    resumed = next(b for a, b in itertools.pairwise(edges) if b - a == gap)
    return [t for t in done if t >= resumed and t < end]


def stall_section(args: argparse.Namespace) -> list[str]:
    lines = [
        "\n| health checks | shard_loss | `add_batch` stalled, s | `Writer.add_batch` stalled, s | samples stalled, s "
        "| errors (writers; learner) | calls after the stall (add_batch; learner) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for health in [h for h in args.health.split(",") if h]:
        tuned = health == "tuned"
        with cluster(tuned=tuned, store_mb=256) as c, tempfile.TemporaryDirectory() as tmp:
            for mode in modes():
                got = one_stall(c, mode, args.stall_s / (4 if tuned else 1), tmp)
                lines.append(
                    f"| {health} | {mode} | {got[0]:.1f} | {got[1]:.1f} | {got[2]:.1f} | {got[3]} | {got[4]} |"
                )
    return lines


def one_stall(c: Any, mode: str, observe_s: float, tmp: str) -> tuple[float, float, float, str, str]:
    """2 shards of small rows, two writer actors (blocking ``add_batch``, a ``Writer``), the driver sampling;
    shard 0's node hard-killed after 2 s: the longest gaps, the errors, and the calls that returned after the
    longest gap; then a fresh node in the dead one's place (for the next mode)."""
    import ray

    extra = {"shard_loss": mode} if "degrade" in modes() else {}
    # a checkpoint path: shards restart only from a cut (without one a lost shard stays lost)
    ckpt = os.path.join(tmp, f"ckpt-{uuid.uuid4().hex[:8]}")
    handle = launch(2, 100_000, tmp, retry_timeout_s=observe_s + 30, checkpoint_path=ckpt, **extra)
    data = small(64)
    handle.add_batch(data)
    handle.add_batch(data)
    placed = handle.node_ids()
    free = [n for n in workers(c) if n not in placed]
    writer = ray.remote(WriterActor).options(**pinned(free[0])).remote()
    batcher = ray.remote(WriterActor).options(**pinned(free[0])).remote()
    ray.get([writer.__ray_ready__.remote(), batcher.__ray_ready__.remote()])
    victim = next(n for n in c.worker_nodes if n.node_id == placed[0])
    start = time.time()
    kill_at, end = start + 2.0, start + 2.0 + observe_s
    wrote = writer.loop.remote(handle, data, end)
    batched = batcher.loop.remote(handle, data, end, True)
    killer = threading.Timer(kill_at - time.time(), lambda: c.remove_node(victim, allow_graceful=False))
    killer.start()
    sampled, learner_errors = [], []
    while time.time() < end:
        try:
            handle.sample_batch(BATCH, timeout=observe_s)
            sampled.append(time.time())
        except Exception as exc:
            learner_errors.append(type(exc).__name__)
    killer.join()
    done, writer_errors = ray.get(wrote)
    done_batched, batcher_errors = ray.get(batched)
    writer_errors += batcher_errors
    add_worker(c, 256)  # the lost capacity back, for the next run
    handle.kill(close_timeout_s=5)
    ray.kill(writer)
    ray.kill(batcher)
    errors = f"{len(writer_errors)}; {len(learner_errors)}"
    if writer_errors or learner_errors:
        errors += f" ({', '.join(sorted(set(writer_errors + learner_errors)))})"
    wrote_gap, sampled_gap = longest_gap(done, kill_at, end), longest_gap(sampled, kill_at, end)
    batched_gap = longest_gap(done_batched, kill_at, end)
    after = f"{len(calls_after(done, kill_at, end))}; {len(calls_after(sampled, kill_at, end))}"
    return wrote_gap, batched_gap, sampled_gap, errors, after
