"""Shared-memory mode with a vector env and stale-aware priority updates, beside the single-process buffer.

* ``add`` of one ``[num_envs]`` env step (a dict of NumPy arrays, as a gymnasium vector env gives it) into a
  plain ``ReplayBuffer(num_envs=E)`` and into the same buffer once shared (one process: the per-step cost).
* ``update_priority`` of 256 rows on a shared ``PrioritizedReplayBuffer``, without and with the sample's
  ``"generation"``.

    PYTHONPATH=. .venv/bin/python benchmarks/shared_envs_bench.py --rounds 5

Rows are MuJoCo-sized transitions (obs 17, action 6 float32). Each round times every case back to back;
printed: the median over rounds and the min-max spread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.distributed.process import become_shared


def env_step(envs: int, rng: np.random.Generator) -> dict[str, Any]:
    return {
        "state": rng.standard_normal((envs, 17), dtype=np.float32),
        "action": rng.standard_normal((envs, 6), dtype=np.float32),
        "reward": rng.standard_normal(envs, dtype=np.float32),
        "next_state": rng.standard_normal((envs, 17), dtype=np.float32),
        "terminated": np.zeros(envs, dtype=np.float32),
    }


def adds(rb: ReplayBuffer, steps: list[dict[str, Any]]) -> float:
    """Seconds per ``add`` call over ``steps``."""
    add = rb.add
    start = time.perf_counter()
    for step in steps:
        add(step)
    return (time.perf_counter() - start) / len(steps)


def add_case(envs: int, shared: bool, steps: list[dict[str, Any]]) -> Callable[[], float]:
    def run() -> float:
        rb = ReplayBuffer("cpu", "cpu", envs * 20_000, seed=0, num_envs=envs)
        rb.add(steps[0])
        if shared:
            become_shared(rb)
        adds(rb, steps[: len(steps) // 10])  # warm the pages and the code paths
        seconds = adds(rb, steps)
        rb.close()
        return seconds

    return run


def update_case(generation: bool, calls: int) -> Callable[[], float]:
    def run() -> float:
        rb = PrioritizedReplayBuffer("cpu", "cpu", 100_000, seed=0, backend="torch")
        rb.add_batch({"state": torch.randn(100_000, 17), "action": torch.randn(100_000, 6)})
        become_shared(rb)
        batches = [rb.sample_batch(256) for _ in range(calls)]
        priorities = torch.rand(256, dtype=torch.float64) + 0.1
        start = time.perf_counter()
        for batch in batches:
            if generation:
                rb.update_priority(batch["index"], priorities, batch["generation"])
            else:
                rb.update_priority(batch["index"], priorities)
        seconds = (time.perf_counter() - start) / calls
        rb.close()
        return seconds

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps timed per add case")
    parser.add_argument("--updates", type=int, default=2_000, help="update_priority calls per case")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases: dict[str, Callable[[], float]] = {}
    for envs in (1, 8):
        steps = [env_step(envs, rng) if envs > 1 else {k: v[0] for k, v in env_step(1, rng).items()}]
        steps = steps * args.steps  # one step object: the cost measured is the buffer's, not the generator's
        cases[f"add, num_envs={envs}, plain"] = add_case(envs, False, steps)
        cases[f"add, num_envs={envs}, shared"] = add_case(envs, True, steps)
    cases["update_priority(256), shared, no generation"] = update_case(False, args.updates)
    cases["update_priority(256), shared, with generation"] = update_case(True, args.updates)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            times[name].append(case())
    print("| case | us/call, median | min-max |")
    print("| --- | --- | --- |")
    for name, values in times.items():
        us = [v * 1e6 for v in values]
        print(f"| {name} | {statistics.median(us):.2f} | {min(us):.2f}-{max(us):.2f} |")
    for envs in (1, 8):
        shared, plain = times[f"add, num_envs={envs}, shared"], times[f"add, num_envs={envs}, plain"]
        ratios = [s / p for s, p in zip(shared, plain, strict=True)]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(f"shared / plain add, num_envs={envs}: {statistics.median(ratios):.2f}x ({spread}), per round")


if __name__ == "__main__":
    main()
