"""Host-to-device sample delivery: objectrl_buffer's pinned staging vs ``tensor.pin_memory().cuda()``.

For CPU storage and a CUDA training device, compares per sample (median µs and GB/s of row bytes):

* ``objectrl_buffer``: ``ReplayBuffer("cuda", "cpu", ...).sample_batch(k)`` (gather into a pinned
  staging ring, non-blocking copy, CUDA events);
* ``pin_memory().cuda()``: ``index_select`` of each column, then ``.pin_memory().cuda()``;
* ``.cuda()`` (pageable): ``index_select`` of each column, then ``.cuda()``.

Each timed call ends with ``torch.cuda.synchronize()`` so the copy is included. Without CUDA it says
so and exits 0.

    python benchmarks/h2d_bench.py [--rows 1000000] [--calls 500]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SHAPES = {
    "mujoco": {"state": ((17,), torch.float32), "action": ((6,), torch.float32), "reward": ((), torch.float32)},
    "atari": {"state": ((4, 84, 84), torch.uint8), "next_state": ((4, 84, 84), torch.uint8)},
}


def timed(fn: Callable[[], object], calls: int) -> float:
    """Median µs per call over blocks of 10 calls, each call synchronised."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    blocks = []
    for _ in range(max(1, calls // 10)):
        t = time.perf_counter_ns()
        for _ in range(10):
            fn()
            torch.cuda.synchronize()
        blocks.append((time.perf_counter_ns() - t) / 10 / 1e3)
    return statistics.median(blocks)


def candidates(rb: Any, cols: dict[str, torch.Tensor], rows: int, k: int) -> list[Callable[[], object]]:
    """The three ways of delivering ``k`` random rows to the GPU."""
    g = torch.Generator().manual_seed(1)

    def ours() -> object:
        return rb.sample_batch(k)

    def pinned() -> object:
        idx = torch.randint(0, rows, (k,), generator=g)
        return {key: c.index_select(0, idx).pin_memory().cuda() for key, c in cols.items()}

    def pageable() -> object:
        idx = torch.randint(0, rows, (k,), generator=g)
        return {key: c.index_select(0, idx).cuda() for key, c in cols.items()}

    return [ours, pinned, pageable]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="stored rows (Atari: rows // 10)")
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("h2d_bench: no CUDA device here; nothing to measure.")
        return
    from objectrl_buffer import ReplayBuffer

    torch.set_num_threads(1)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    header = ["rows", "batch", "bytes/sample", "objectrl_buffer µs (GB/s)", "pin_memory().cuda() µs (GB/s)"]
    print("| " + " | ".join([*header, ".cuda() µs (GB/s)"]) + " |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, spec in SHAPES.items():
        rows = args.rows if name == "mujoco" else max(1000, args.rows // 10)
        g = torch.Generator().manual_seed(0)
        data = {
            k: torch.randint(0, 256, (rows, *s), generator=g, dtype=d) if d == torch.uint8 else torch.randn(rows, *s)
            for k, (s, d) in spec.items()
        }
        rb = ReplayBuffer("cuda", "cpu", rows, seed=0)
        rb.add_batch(data)
        cols = rb.engine.storage.columns
        for k in (256, 1024, 4096) if name == "mujoco" else (32, 256):
            nbytes = k * sum(torch.Size(s).numel() * d.itemsize for s, d in spec.values())

            cells = []
            for fn in candidates(rb, cols, rows, k):
                us = timed(fn, args.calls)
                cells.append(f"{us:.0f} ({nbytes / us / 1e3:.2f})")
            print(f"| {name} {rows} | {k} | {nbytes} | " + " | ".join(cells) + " |")
        rb.close()


if __name__ == "__main__":
    main()
