"""Many writers, one buffer: rows/s into a single-process buffer, a SharedBuffer (1 and N fork writers), a
rate-limited buffer, and a Ray RemoteBuffer beside torchrl's RayReplayBuffer (writes of 256-row batches,
single adds through ``writer()`` from writer actors on the node, sample(256) latency and rate, prefetch), and
per-step single adds by 1, 2 and 4 writer processes into one plain ``ReplayBuffer`` shared with them
(multiprocessing's pickler: shared-memory mode) beside the same adds into a plain single-process buffer.

    PYTHONPATH=. .venv/bin/python benchmarks/distributed_bench.py --rows 200000 --writers 2 [--no-ray | --ray-only]
    PYTHONPATH=. .venv/bin/python benchmarks/distributed_bench.py --shared-only --rounds 3 [--start-method spawn]
    PYTHONPATH=. .venv/bin/python benchmarks/distributed_bench.py --cluster [--quick] [--sections inserts,stall]

``--cluster``: a simulated 3-node Ray cluster (benchmarks/distributed_cluster.py): inserts, sample(256) with 1
and 2 shards and how a sample ships its rows, beside torchrl's RayReplayBuffer, and the stall after a node loss.

Rows are MuJoCo-sized transitions (obs 17, action 6 float32). One run, medians of the timed rounds; the
machine is shared, so compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import distributed_cluster
import numpy as np
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.distributed import SharedBuffer
from objectrl_buffer.flow import MinSize, limited

BATCH = 256
PEER_ADDS = 500  # torchrl RayReplayBuffer.add calls timed (one blocking round trip each)


def batch(n: int = BATCH) -> dict[str, torch.Tensor]:
    return {
        "state": torch.randn(n, 17),
        "action": torch.randn(n, 6),
        "reward": torch.randn(n),
        "next_state": torch.randn(n, 17),
        "terminated": torch.zeros(n, dtype=torch.bool),
    }


def rate(write: Any, rows: int, data: Any = None) -> float:
    data = batch() if data is None else data
    start = time.perf_counter()
    for _ in range(rows // BATCH):
        write(data)
    return (rows // BATCH) * BATCH / (time.perf_counter() - start)


def shared_writer(buffer: SharedBuffer, rows: int, out: Any) -> None:
    out.put(rate(buffer.add_batch, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--ray-only", action="store_true", help="only the Ray rows (RemoteBuffer vs torchrl)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each Ray measure (median, spread)")
    parser.add_argument(
        "--shared-only", action="store_true", help="only single adds by 1, 2, 4 writer processes (no Ray)"
    )
    parser.add_argument("--mujoco-rows", type=int, default=50_000, help="--shared-only: rows per writer, MuJoCo")
    parser.add_argument("--atari-rows", type=int, default=5_000, help="--shared-only: rows per writer, Atari")
    parser.add_argument("--start-method", choices=["fork", "spawn"], default="fork", help="--shared-only")
    parser.add_argument(
        "--transport-only",
        action="store_true",
        help="only a driver writer's single adds at batch_size 1024 and 4096, shared files vs through Ray",
    )
    distributed_cluster.add_arguments(parser)
    args = parser.parse_args()
    if args.cluster:
        print("\n".join(distributed_cluster.run(args)))
        return
    results: dict[str, Any] = {}
    if args.transport_only:
        report(transport_results(args.rows, args.rounds))
        return
    if args.shared_only:
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, cores: {os.cpu_count()}")
        results.update(many_writer_results(args.rounds, args.mujoco_rows, args.atari_rows, args.start_method))
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        report(results)
        return
    if args.ray_only:
        results.update(ray_results(args.rows, args.writers, args.rounds))
        report(results)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rb = ReplayBuffer("cpu", "cpu", args.rows, seed=0, storage_dir=tmp)
        rate(rb.add_batch, args.rows)  # warm-up: storage reserved and pages mapped, as for the runs below
        rb.reset()
        results["single process add_batch(256), rows/s"] = rate(rb.add_batch, args.rows)
        rb.reset()
        limited_rb = limited(rb, MinSize(1))
        results["limited(MinSize) add_batch(256), rows/s"] = rate(limited_rb.add_batch, args.rows)
        rb.close()
    schema, _ = Schema.infer(batch(1), batch_dims=1)
    with SharedBuffer.create(schema, args.rows * (args.writers + 1), seed=0) as shared:
        results["SharedBuffer 1 process add_batch(256), rows/s"] = rate(shared.add_batch, args.rows)
        ctx = mp.get_context("spawn")  # fork after torch used its OpenMP pool can hang the child
        out = ctx.Queue()
        procs = [ctx.Process(target=shared_writer, args=(shared, args.rows, out)) for _ in range(args.writers)]
        for p in procs:
            p.start()
        per = [out.get() for _ in procs]
        for p in procs:
            p.join()
        results[f"SharedBuffer {args.writers} spawn writers, rows/s per writer (median)"] = statistics.median(per)
        times = []
        for _ in range(200):
            start = time.perf_counter()
            shared.sample_batch(BATCH)
            times.append(time.perf_counter() - start)
        results["SharedBuffer sample(256) p50, ms"] = 1000 * statistics.median(times)
    if not args.no_ray:
        results.update(ray_results(args.rows, args.writers, args.rounds))
    report(results)


def report(results: dict[str, Any]) -> None:
    print("| measure | value (median of rounds; spread min-max) |\n| --- | --- |")
    for name, value in results.items():
        if isinstance(value, list):
            med, low, high = statistics.median(value), min(value), max(value)
            fmt = "{:,.3f}" if med < 100 else "{:,.0f}"
            print(f"| {name} | {fmt.format(med)} ({fmt.format(low)}-{fmt.format(high)}) |")
        else:
            print(f"| {name} | {value:,.3f} |" if value < 100 else f"| {name} | {value:,.0f} |")


# ------------------------------------------------------------------ shared-memory mode: many writer processes
POOL = 64  # distinct rows each writer cycles through (what an env loop hands over: fresh arrays, no copies)
ATARI_CAPACITY = 8_192  # 2 x 28 KB a row: ~0.46 GB a buffer; writers wrap around it


def mujoco_row(i: int) -> dict[str, Any]:
    """What a gymnasium MuJoCo loop holds per step: float32 arrays and Python numbers."""
    return {
        "state": np.full(17, i, np.float32),
        "action": np.full(6, i, np.float32),
        "reward": float(i),
        "next_state": np.full(17, i + 1, np.float32),
        "terminated": False,
    }


def atari_row(i: int) -> dict[str, Any]:
    """An Atari step: stacked uint8 frames, a discrete action, a float reward."""
    return {
        "state": np.full((4, 84, 84), i % 251, np.uint8),
        "action": i % 6,
        "reward": float(i),
        "next_state": np.full((4, 84, 84), (i + 1) % 251, np.uint8),
        "terminated": False,
    }


ROWS: dict[str, Callable[[int], dict[str, Any]]] = {"MuJoCo": mujoco_row, "Atari": atari_row}


def add_rows(add: Callable[[Any], None], pool: list[dict[str, Any]], n: int) -> None:
    for i in range(n):
        add(pool[i % POOL])


def touch(rb: Any) -> None:
    """Fault in this process's mapping of every shared page (one read a page), as a writer's first pass over
    the ring does: a fresh mapping (spawn, and fork too: the kernel does not copy page tables of shared file
    mappings) pays one minor fault per 4 KB page at its first touch (an Atari row spans ~14 pages); rows of
    a page or more are mapped through the buffer's own chunk mapping, so that they are marked mapped as
    after a first pass (see objectrl_buffer/distributed/shared.py)."""
    shared = rb.shared
    if shared.chunk_rows:  # rows of a page or more: the writer's own first pass maps them chunk by chunk
        shared.map_slots(0, shared.capacity)
    for column in [*shared.columns.values(), shared.slots.gens]:
        # NumPy, not torch: a torch reduction in a fork child whose parent used OpenMP hangs in libgomp
        int(column.numpy().reshape(-1).view(np.uint8)[::4096].sum())


def timed_writer(rb: ReplayBuffer, kind: str, n: int, warm: bool, barrier: Any, out: Any) -> None:
    """A writer process: wait for every writer, then ``n`` single adds; report its (start, end) clock."""
    pool = [ROWS[kind](i) for i in range(POOL)]
    add = rb.add
    add(pool[0])  # first use in this process (the lock file opened): not timed
    if warm:
        touch(rb)
    barrier.wait()
    start = time.perf_counter()  # CLOCK_MONOTONIC on Linux: one clock for every process
    add_rows(add, pool, n)
    out.put((start, time.perf_counter()))


def filled(kind: str, capacity: int) -> ReplayBuffer:
    """A plain buffer full of rows (every page of its storage touched: no first-write faults in a timed run)."""
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0)
    pool = [ROWS[kind](i) for i in range(POOL)]
    chunk = {k: np.stack([np.asarray(row[k]) for row in pool]) for k in pool[0]}
    for _ in range(-(-capacity // POOL)):
        rb.add_batch(chunk)
    return rb


def cpu_per_add(add: Callable[[Any], None], pool: list[dict[str, Any]], n: int = 20_000) -> float:
    """CPU time of one call in this process (``time.process_time``: not the time waiting for a core), in us."""
    start = time.process_time()
    add_rows(add, pool, n)
    return 1e6 * (time.process_time() - start) / n


def many_writer_results(rounds: int, mujoco_rows: int, atari_rows: int, method: str) -> dict[str, Any]:
    """Per-step ``add`` by 1, 2, 4 writer processes into one shared plain buffer, beside single-process adds."""
    out: dict[str, list[float]] = {}

    def put(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    ctx = mp.get_context(method)
    for kind, per_writer in (("MuJoCo", mujoco_rows), ("Atari", atari_rows)):
        capacity = 4 * per_writer if kind == "MuJoCo" else min(4 * per_writer, ATARI_CAPACITY)
        pool = [ROWS[kind](i) for i in range(POOL)]
        plain = filled(kind, capacity)
        shared = filled(kind, capacity)
        queue = mp.get_context("fork").SimpleQueue()  # multiprocessing's pickler: the buffer becomes shared
        queue.put(shared)
        queue.get().close()
        add_rows(plain.add, pool, per_writer)  # warm
        add_rows(shared.add, pool, per_writer)
        for _ in range(rounds):
            start = time.perf_counter()
            add_rows(plain.add, pool, per_writer)
            single = per_writer / (time.perf_counter() - start)
            put(f"{kind}: plain ReplayBuffer, 1 process, add(), rows/s", single)
            for writers, warm in itertools.product((1, 2, 4), (False, True)):
                barrier, spans = ctx.Barrier(writers), ctx.Queue()
                procs = [
                    ctx.Process(target=timed_writer, args=(shared, kind, per_writer, warm, barrier, spans))
                    for _ in range(writers)
                ]
                for p in procs:
                    p.start()
                times = [spans.get() for _ in procs]
                for p in procs:
                    p.join()
                    assert p.exitcode == 0, p.exitcode
                each = [per_writer / (end - begin) for begin, end in times]
                wall = max(end for _, end in times) - min(begin for begin, _ in times)
                name = f"{kind}: shared, {writers} writer(s), {'warm' if warm else 'cold'} mapping"
                put(f"{name}, rows/s per writer (median)", statistics.median(each))
                put(f"{name}, rows/s (all)", writers * per_writer / wall)
                put(f"{name}, single / shared per writer", single / statistics.median(each))
        assert len(shared) == capacity and shared.sample_batch(BATCH).batch_size[0] == BATCH
        # where a shared add's time goes, CPU time in this one process (no other writer, no waiting for a core)
        slots = shared.shared.slots
        for _ in range(rounds):
            put(f"{kind}: CPU us per add(), plain", cpu_per_add(plain.add, pool))
            put(f"{kind}: CPU us per add(), shared", cpu_per_add(shared.add, pool))
            # reserved, never written: those slots read as unfinished (skipped by samples) until rewritten
            reserve_us = cpu_per_add(lambda _, s=slots: s.reserve(1), pool)
            how = "the flock pair" if slots.counter is None else "one atomic fetch-add"
            put(f"{kind}: CPU us per reserve(1) alone ({how})", reserve_us)
        plain.close()
        shared.close()
    return dict(out)


# ---------------------------------------------------------------------------------------------- Ray
def _latencies(call: Any, n: int, work_s: float = 0.0) -> tuple[float, float]:
    """``(p50 ms, calls/s)`` of ``call()`` timed alone, with ``work_s`` of learner work between calls."""
    times = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
        if work_s:
            busy_until = time.perf_counter() + work_s
            while time.perf_counter() < busy_until:  # a learner's step keeps its core busy
                pass
    return 1000 * statistics.median(times), n / (time.perf_counter() - start)


def _row(i: int) -> dict[str, Any]:
    import numpy as np

    return {
        "state": np.full(17, i, np.float32),
        "action": np.zeros(6, np.float32),
        "reward": float(i),
        "next_state": np.zeros(17, np.float32),
        "terminated": False,
    }


def _single_adds(handle: Any, rows: int, same_node: bool | None = None) -> None:
    """``rows`` single adds through ``handle.writer()``, cycling through ``POOL`` prebuilt rows (what an env
    loop hands over: fresh arrays and Python numbers; building them is the env's cost, not the buffer's).
    ``same_node``: the writer's (``None``: batches through shared files to a shard on this node)."""
    pool = [_row(i) for i in range(POOL)]
    with handle.writer(batch_size=1024, max_in_flight=4, same_node=same_node) as writer:
        add = writer.add
        for i in range(rows):
            add(pool[i % POOL])


class WriterActor:
    """A writer process on the node: single adds through ``handle.writer()``."""

    def run(self, handle: Any, rows: int, same_node: bool | None = None) -> tuple[float, float]:
        start = time.time()
        _single_adds(handle, rows, same_node)
        return start, time.time()


def ray_results(rows: int, writers: int, rounds: int) -> dict[str, Any]:
    """RemoteBuffer beside torchrl's RayReplayBuffer, both served by actors of one local Ray."""
    from functools import partial

    import ray
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    from objectrl_buffer.distributed import RemoteBuffer

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, list[float]] = {}

    def put(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    data = batch()
    numpy_data = {k: v.numpy() for k, v in data.items()}
    with tempfile.TemporaryDirectory() as tmp:
        remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", rows, seed=0, storage_dir=tmp)
        two = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", rows, num_shards=2, seed=0, storage_dir=tmp)
        peer = RayReplayBuffer(
            storage=partial(LazyTensorStorage, rows), batch_size=BATCH, remote_config={"num_cpus": 0}
        )
        peer_td = TensorDict(data, [BATCH])
        peer_rows = [TensorDict({k: torch.as_tensor(v) for k, v in _row(i).items()}, []) for i in range(POOL)]
        actors = [ray.remote(WriterActor).options(num_cpus=0).remote() for _ in range(writers)]
        ray.get([a.run.remote(remote, 8) for a in actors])  # started and warm
        for warm in (remote.add_batch, two.add_batch, two.add_batch):
            warm(numpy_data)
        peer.extend(peer_td)
        n_batches = max(20, rows // 8 // BATCH)
        for _ in range(rounds):
            put("torchrl RayReplayBuffer extend(256), rows/s", rate(peer.extend, n_batches * BATCH, peer_td))
            put(
                "RemoteBuffer add_batch(256) blocking, driver, rows/s",
                rate(remote.add_batch, n_batches * BATCH, numpy_data),
            )
            start = time.perf_counter()
            with remote.writer(max_in_flight=4) as writer:  # timed until the last batch is stored
                rate(writer.add_batch, n_batches * BATCH, numpy_data)
            put(
                "RemoteBuffer writer().add_batch(256) pipelined, driver, rows/s",
                n_batches * BATCH / (time.perf_counter() - start),
            )
            single = rows // 2  # enough rows that a writer's start (its files, one node id call) is noise
            for same_node, how in ((None, "shared files"), (False, "through Ray")):  # back to back
                start = time.perf_counter()
                _single_adds(remote, single, same_node)
                put(
                    f"RemoteBuffer writer() single adds ({how}), driver, rows/s",
                    single / (time.perf_counter() - start),
                )
            start = time.perf_counter()
            for i in range(PEER_ADDS):  # one blocking actor call per row: a few hundred are enough
                peer.add(peer_rows[i % POOL])
            put("torchrl RayReplayBuffer add(), driver, rows/s", PEER_ADDS / (time.perf_counter() - start))
            per = single // writers
            for same_node, how in ((None, "shared files"), (False, "through Ray")):
                spans = ray.get([a.run.remote(remote, per, same_node) for a in actors])
                wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
                put(
                    f"RemoteBuffer writer() single adds ({how}), {writers} writer actors, rows/s (all)",
                    per * writers / wall,
                )
            p50, per_s = _latencies(lambda: peer.sample(BATCH), 200)
            put("torchrl RayReplayBuffer sample(256) p50, ms", p50)
            put("torchrl RayReplayBuffer sample(256), samples/s", per_s)
            p50, per_s = _latencies(lambda: remote.sample_batch(BATCH), 200)
            put("RemoteBuffer sample_batch(256) p50, ms", p50)
            put("RemoteBuffer sample_batch(256), samples/s", per_s)
            p50, per_s = _latencies(lambda: two.sample_batch(BATCH), 200)
            put("RemoteBuffer 2 shards sample_batch(256) p50, ms", p50)
            stream = remote.prefetch(BATCH, depth=4)
            take = partial(next, stream)
            take()
            p50, per_s = _latencies(take, 200)
            put("RemoteBuffer prefetch(256, depth=4), back to back: next() p50, ms", p50)
            put("RemoteBuffer prefetch(256, depth=4), back to back: samples/s", per_s)
            p50, per_s = _latencies(take, 200, work_s=0.002)
            put("RemoteBuffer prefetch(256, depth=4), 2 ms learner step: next() p50, ms", p50)
            stream.close()
        # where a sample's time goes: Ray's empty call, and 256 rows as NumPy vs torch through Ray
        probe = ray.remote(_Probe).options(num_cpus=0).remote()
        ray.get(probe.empty.remote())
        for _ in range(rounds):
            put("Ray empty actor call p50, ms", _latencies(lambda: ray.get(probe.empty.remote()), 200)[0])
            put(
                "Ray call returning 256 rows as NumPy p50, ms",
                _latencies(lambda: ray.get(probe.rows.remote(False)), 200)[0],
            )
            put(
                "Ray call returning 256 rows as torch p50, ms",
                _latencies(lambda: ray.get(probe.rows.remote(True)), 200)[0],
            )
        remote.kill()
        two.kill()
        for actor in [*actors, probe]:
            ray.kill(actor)
        peer.shutdown()
    ray.shutdown()
    return dict(out)


def transport_results(rows: int, rounds: int) -> dict[str, Any]:
    """Single adds from the driver into a one-shard RemoteBuffer: rows/s and the driver's CPU time a row,
    batches through same-node shared files (``same_node`` automatic) vs through Ray, back to back."""
    import ray

    from objectrl_buffer.distributed import RemoteBuffer

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", rows, seed=0, storage_dir=tmp)
        _single_adds(remote, 4096)  # warm
        for _ in range(rounds):
            for size in (1024, 4096):
                for same_node, how in ((None, "shared files"), (False, "through Ray")):
                    pool = [_row(i) for i in range(POOL)]
                    start, cpu = time.perf_counter(), time.process_time()
                    with remote.writer(batch_size=size, max_in_flight=4, same_node=same_node) as writer:
                        add = writer.add
                        for i in range(rows):
                            add(pool[i % POOL])
                    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                    out.setdefault(f"writer(batch_size={size}) single adds ({how}), rows/s", []).append(rows / wall)
                    out.setdefault(f"writer(batch_size={size}) ({how}): driver CPU us a row", []).append(
                        1e6 * cpu / rows
                    )
        remote.kill()
    ray.shutdown()
    return dict(out)


class _Probe:
    def empty(self) -> int:
        return 1

    def rows(self, as_torch: bool) -> dict[str, Any]:
        data = batch()
        return data if as_torch else {k: v.numpy() for k, v in data.items()}


if __name__ == "__main__":
    main()
