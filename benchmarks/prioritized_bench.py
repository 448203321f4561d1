"""Prioritized replay cost: PER sample(256) + update_priority against uniform sample_batch(256).

Rows are ObjectRL-shaped transitions (state/next_state 17 floats, action 6, reward, terminated,
truncated). Each workload runs ``--blocks`` blocks of ``--calls`` calls after a warm-up; the table gives
the median time per call over blocks (and the spread between the fastest and slowest block).

Rows compared (all on the same storing device, same number of rows):
* uniform: ``ReplayBuffer.sample_batch(k)``
* PER sample / update / sample+update: ``PrioritizedReplayBuffer`` (our sum tree, or torchrl's
  ``PrioritizedSampler`` with ``--backend torchrl`` when its extension loads)
* torchrl PER: ``TensorDictPrioritizedReplayBuffer`` sample + update_priority, where its extension loads
* sum tree alone: ``SumTree.sample(k)`` and ``update`` of ``k`` slots (no row reads)
* add: one ``add`` per call, uniform and prioritized (PER's new-row priority write)
* the other sampling options on the uniform buffer: n-step, recency window, trajectory slices

Usage (from the repository root, with objectrl_buffer importable)::

    python benchmarks/prioritized_bench.py                 # 1M rows, CPU
    python benchmarks/prioritized_bench.py --rows 100000 --device cuda
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer, SumTree, torchrl_per_available

logging.getLogger("torchrl").setLevel(logging.WARNING)


def transitions(n: int, start: int, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(start)
    state = torch.randn(n, 17, generator=gen)
    return {
        "state": state.to(device),
        "action": torch.randn(n, 6, generator=gen).to(device),
        "reward": torch.randn(n, generator=gen).to(device),
        "next_state": (state + 0.1).to(device),
        "terminated": (torch.rand(n, generator=gen) < 0.001).float().to(device),
        "truncated": torch.zeros(n, device=device),
    }


def fill(rb: ReplayBuffer, rows: int, device: torch.device, chunk: int = 100_000) -> None:
    for start in range(0, rows, chunk):
        rb.add_batch(transitions(min(chunk, rows - start), start, device))


def measure(fn: Callable[[], object], calls: int, blocks: int, device: torch.device) -> tuple[float, float, float]:
    """(median, min, max) microseconds per call over ``blocks`` blocks of ``calls`` calls."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(max(3, calls // 5)):
        fn()
    per_call = []
    for _ in range(blocks):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_call), min(per_call), max(per_call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--device", default="cpu", help="storing and sampling device")
    parser.add_argument("--backend", default="torch", choices=["torch", "torchrl"], help="index of our PER buffer")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    k, rows = args.batch, args.rows
    folder = tempfile.mkdtemp(prefix="prioritized-bench-")
    results: list[tuple[str, tuple[float, float, float]]] = []

    def run(name: str, fn: Callable[[], object], calls: int | None = None) -> None:
        results.append((name, measure(fn, calls or args.calls, args.blocks, device)))
        print(f"  {name}: {results[-1][1][0]:.1f} us", flush=True)

    print(f"filling {rows} rows on {device} ...", flush=True)
    uniform = ReplayBuffer(device, device, rows, seed=0, storage_dir=folder)
    fill(uniform, rows, device)
    run(f"uniform sample_batch({k})", lambda: uniform.sample_batch(k))
    run(f"uniform sample_batch({k}, n_step=3)", lambda: uniform.sample_batch(k, n_step=3, gamma=0.99))
    run(f"uniform sample_batch({k}, recent=10000)", lambda: uniform.sample_batch(k, recent=10_000))
    run("sample_slices(16, 16)", lambda: uniform.sample_slices(16, 16))

    per = PrioritizedReplayBuffer(device, device, rows, seed=0, storage_dir=folder, backend=args.backend)
    fill(per, rows, device)
    per.update_priority(torch.arange(rows, device=device), torch.rand(rows, device=device) * 3)
    priorities = torch.rand(k, device=device) + 0.01
    last = per.sample_batch(k)

    def sample_and_update() -> None:
        batch = per.sample_batch(k)
        per.update_priority(batch["index"], priorities)

    run(f"PER ({per.backend}) sample_batch({k})", lambda: per.sample_batch(k))
    run(f"PER ({per.backend}) update_priority({k})", lambda: per.update_priority(last["index"], priorities))
    run(f"PER ({per.backend}) sample_batch({k}) + update_priority", sample_and_update)

    tree = SumTree(rows, device)
    tree.rebuild(torch.rand(rows, dtype=torch.float64, device=device))
    gen = torch.Generator(device=device).manual_seed(0)
    slots = torch.randperm(rows, device=device)[:k]
    weights = torch.rand(k, dtype=torch.float64, device=device)
    run(f"SumTree.sample({k})", lambda: tree.sample(k, gen))
    run(f"SumTree.update({k})", lambda: tree.update(slots, weights))

    if torchrl_per_available(device):
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        trb = TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=LazyTensorStorage(rows, device=device), batch_size=k
        )
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            trb.extend(TensorDict(transitions(n, start, device), batch_size=[n]))

        def torchrl_sample_and_update() -> None:
            batch = trb.sample()
            trb.update_priority(batch["index"], priorities)

        run(f"torchrl TensorDictPrioritizedReplayBuffer sample({k}) + update_priority", torchrl_sample_and_update)
    else:
        print("  torchrl PrioritizedSampler: its compiled extension does not load here; row skipped", flush=True)

    one = {key: value[0] for key, value in transitions(1, 0, device).items()}
    run("uniform add (1 row)", lambda: uniform.add(one), calls=args.calls * 5)
    run("PER add (1 row)", lambda: per.add(one), calls=args.calls * 5)

    base = results[0][1][0]
    print(f"\n{rows} rows, batch {k}, device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}\n")
    print("| workload | median us/call | fastest..slowest block | vs uniform sample |")
    print("|---|---:|---:|---:|")
    for name, (median, low, high) in results:
        print(f"| {name} | {median:.1f} | {low:.1f}..{high:.1f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
