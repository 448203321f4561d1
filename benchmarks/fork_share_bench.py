"""What sharing a CPU buffer before every fork would cost (the rejected option for the fork hazard).

Measures, back to back in one run: ``become_shared`` of a buffer holding N MuJoCo-sized rows (the copy into
/dev/shm that a ``register_at_fork(before=...)`` hook would pay at every first fork), the per-call ``add``
of a plain and of a shared buffer (the path the parent would be switched to), and a ``fork`` + ``join`` of
a child with and without the read-only guard on 10 live buffers.

    PYTHONPATH=. python benchmarks/fork_share_bench.py --repeat 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed import become_shared

ROW = {
    "obs": np.zeros(17, np.float32),
    "action": np.zeros(6, np.float32),
    "reward": 0.0,
    "next_obs": np.zeros(17, np.float32),
    "done": False,
}


def filled(n: int) -> ReplayBuffer:
    rb = ReplayBuffer("cpu", "cpu", n, seed=0)
    rb.add_batch({k: np.repeat(np.asarray(v)[None], n, axis=0) for k, v in ROW.items()})
    return rb


def per_add_us(rb: ReplayBuffer, n: int = 20_000) -> float:
    add = rb.add
    start = time.perf_counter()
    for _ in range(n):
        add(ROW)
    return (time.perf_counter() - start) / n * 1e6


def nothing() -> None:
    pass


def fork_ms(buffers: int) -> float:
    kept = [filled(100) for _ in range(buffers)]
    start = time.perf_counter()
    p = mp.get_context("fork").Process(target=nothing)
    p.start()
    p.join()
    out = (time.perf_counter() - start) * 1e3
    for rb in kept:
        rb.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for n in (100_000, 1_000_000):
            rb = filled(n)
            start = time.perf_counter()
            become_shared(rb)
            results.setdefault(f"become_shared {n:>9,} rows (ms)", []).append((time.perf_counter() - start) * 1e3)
            rb.close()
        plain = filled(100_000)
        shared = filled(100_000)
        become_shared(shared)
        results.setdefault("add, plain buffer (us/call)", []).append(per_add_us(plain))
        results.setdefault("add, shared buffer (us/call)", []).append(per_add_us(shared))
        plain.close()
        shared.close()
        results.setdefault("fork+join, 0 live buffers (ms)", []).append(fork_ms(0))
        results.setdefault("fork+join, 10 live buffers guarded (ms)", []).append(fork_ms(10))
    for name, values in results.items():
        print(f"{name:45s} median {statistics.median(values):9.2f}  min {min(values):9.2f}  max {max(values):9.2f}")


if __name__ == "__main__":
    main()
