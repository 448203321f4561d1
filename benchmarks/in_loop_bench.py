"""Per-call cost inside a training loop: objectrl_buffer against the NumPy-ring floor, warm and cold.

Inside ObjectRL's trainer (``objectrl_harness.py``) an ``add`` costs 4-5x what ``bench.py`` measures
back to back: between two buffer calls the trainer runs a gradient step, which evicts the buffer's code
and data from the CPU caches. This script shows that the floor (a NumPy ring, read from ObjectRL's
TensorDict the cheapest way) pays the same: each call is timed back to back and right after a gradient
step of a small MLP, for both.

    python benchmarks/in_loop_bench.py             # ~20 s
    python benchmarks/in_loop_bench.py --batch 256 --calls 3000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # this checkout's objectrl_buffer

from objectrl_buffer import ReplayBuffer  # noqa: E402
from objectrl_buffer.storage.torchrl_compat import plain_items  # noqa: E402


def transitions(n: int, seed: int = 0) -> list[TensorDict]:
    """CartPole-sized transitions built as ObjectRL's agent builds them (tensors, Python floats, int step)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(n):
        row = {
            "state": torch.randn(4, generator=g),
            "action": torch.randint(0, 2, (1,), generator=g),
            "reward": 1.0,
            "next_state": torch.randn(4, generator=g),
            "terminated": 0.0,
            "truncated": 0.0,
            "step": step + 1,
        }
        out.append(TensorDict(row))
    return out


class Floor:
    """A NumPy ring: the TensorDict's values read with ``numpy()``/``item()``, ``take`` to sample."""

    def __init__(self, capacity: int, example: TensorDict, seed: int = 0) -> None:
        self.cols = {k: torch.empty((capacity, *v.shape), dtype=v.dtype).numpy() for k, v in example.items()}
        self.capacity, self.ptr, self.size = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, td: TensorDict) -> None:
        p = self.ptr
        for k, v in plain_items(td, 0).items():  # type: ignore[union-attr]
            self.cols[k][p] = v.numpy() if v.dim() else v.item()
        self.ptr = p + 1 if p + 1 < self.capacity else 0
        self.size = min(self.size + 1, self.capacity)

    def sample(self, k: int) -> dict[str, torch.Tensor]:
        idx = self.rng.integers(0, self.size, k)
        return {key: torch.from_numpy(c.take(idx, axis=0)) for key, c in self.cols.items()}


def timed(call: Callable[[int], Any], calls: int, between: Callable[[], None] | None) -> float:
    """Median µs of ``call(i)``, each call preceded (untimed) by ``between()`` when given."""
    durations = []
    for i in range(calls):
        if between is not None:
            between()
        t = time.perf_counter_ns()
        call(i)
        durations.append(time.perf_counter_ns() - t)
    return statistics.median(durations) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64, help="rows per sample (ObjectRL's DQN: 64)")
    ap.add_argument("--capacity", type=int, default=1_000_000)
    args = ap.parse_args()
    torch.set_num_threads(1)

    data = transitions(args.calls)
    rb = ReplayBuffer("cpu", "cpu", args.capacity, seed=0)
    floor = Floor(args.capacity, data[0])
    for td in data:  # both hold the same rows before anything is timed
        rb.add(td)
        floor.add(td)
    rb.get_steps_and_iterator(0, 10**9, args.batch)

    net = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    net.append(torch.nn.ReLU()).append(torch.nn.Linear(256, 2))
    opt = torch.optim.Adam(net.parameters())

    def gradient_step() -> None:
        loss = net(torch.randn(args.batch, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    k = args.batch
    cases: list[tuple[str, Callable[[int], Any], Callable[[int], Any]]] = [
        ("add (ObjectRL's TensorDict)", lambda i: floor.add(data[i]), lambda i: rb.add(data[i])),
        (f"sample / get_next_batch({k})", lambda i: floor.sample(k), lambda i: rb.get_next_batch(k)),
    ]
    print(f"median µs per call, {args.calls} calls, torch.set_num_threads(1)\n")
    print("| call | when | floor (NumPy ring) | objectrl_buffer | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, floor_call, our_call in cases:
        for when, between in (("back to back", None), ("after a gradient step", gradient_step)):
            f = timed(floor_call, args.calls, between)
            o = timed(our_call, args.calls, between)
            print(f"| {name} | {when} | {f:.1f} | {o:.1f} | {o / f:.2f}x |")


if __name__ == "__main__":
    main()
