"""Many writers, one buffer: rows/s into a single-process buffer, a SharedBuffer (1 and N fork writers), a
rate-limited buffer, and a Ray RemoteBuffer (driver writes of 256-row batches, sample(256) latency).

    .venv/bin/python benchmarks/distributed_bench.py --rows 200000 --writers 2 [--no-ray]

Rows are MuJoCo-sized transitions (obs 17, action 6 float32). One run, medians of the timed rounds; the
machine is shared, so compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from typing import Any

import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.distributed import SharedBuffer
from objectrl_buffer.flow import MinSize, limited

BATCH = 256


def batch(n: int = BATCH) -> dict[str, torch.Tensor]:
    return {
        "state": torch.randn(n, 17),
        "action": torch.randn(n, 6),
        "reward": torch.randn(n),
        "next_state": torch.randn(n, 17),
        "terminated": torch.zeros(n, dtype=torch.bool),
    }


def rate(write: Any, rows: int) -> float:
    data = batch()
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
    args = parser.parse_args()
    results: dict[str, float] = {}
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
        import ray

        from objectrl_buffer.distributed import RemoteBuffer

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        with tempfile.TemporaryDirectory() as tmp:
            remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", args.rows, seed=0, storage_dir=tmp)
            results["RemoteBuffer (1 shard) driver add_batch(256), rows/s"] = rate(remote.add_batch, args.rows // 4)
            times = []
            for _ in range(200):
                start = time.perf_counter()
                remote.sample_batch(BATCH)
                times.append(time.perf_counter() - start)
            results["RemoteBuffer sample(256) p50, ms"] = 1000 * statistics.median(times)
            remote.kill()
        ray.shutdown()
    print("| measure | value |\n| --- | --- |")
    for name, value in results.items():
        print(f"| {name} | {value:,.3f} |" if value < 100 else f"| {name} | {value:,.0f} |")


if __name__ == "__main__":
    main()
