"""Cost of ``reset()`` and of the first ``add_batch`` after it, as ObjectRL's PPO pays them twice per learn call.

Workload: a PPO rollout of ``--rows`` (2,048) transitions as ObjectRL builds it (HalfCheetah sizes: state and
next_state float32[17], action float32[6], reward/terminated/truncated float32, step int64, action_logprob,
value, next_state_value float32), one TensorDict of batch size ``[rows]``. Each round: ``reset()``, then
``add_batch(rollout)``; both timed. Capacities: ObjectRL's default ``buffer_size`` (1,000,000) and a small
one (4,096); the cost should not depend on the capacity. Libraries: objectrl_buffer with its default
placement (``/dev/shm``), and upstream ObjectRL 0.2.1's ``ReplayBuffer`` (loaded from its wheel, as
``bench.py`` does; skipped with a note when the wheel is not available).

Each (library, capacity) runs in its own child process with one intra-op thread; medians and 90th
percentiles of ``--rounds`` rounds after ``--warmup`` rounds are printed as a markdown table.

    python benchmarks/reset_bench.py                      # both capacities, both libraries
    python benchmarks/reset_bench.py --objectrl-wheel objectrl-0.2.1-py3-none-any.whl --rounds 50
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from workloads import MUJOCO  # run as a script: benchmarks/ is on sys.path

HERE = Path(__file__).resolve().parent
LIBRARIES = {"objectrl_buffer": "objectrl_buffer", "objectrl": "ObjectRL 0.2.1"}
PATTERNS = {"same": "same", "ppo": "alternating (PPO: + advantages, returns)"}
# ObjectRL's PPO rows: the MuJoCo transition of the other workloads plus PPO's three keys
FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    **MUJOCO,
    "action_logprob": ((), torch.float32),
    "value": ((), torch.float32),
    "next_state_value": ((), torch.float32),
}


def rollout(rows: int) -> Any:
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(0)
    data = {}
    for key, (shape, dtype) in FIELDS.items():
        if dtype == torch.int64:
            data[key] = torch.arange(rows)
        else:
            data[key] = torch.randn((rows, *shape), generator=g, dtype=dtype)
    return TensorDict(data, batch_size=[rows])


def make_buffer(library: str, capacity: int, upstream: str | None) -> Any:
    if library == "objectrl_buffer":
        from objectrl_buffer import ReplayBuffer

        return ReplayBuffer("cpu", "cpu", capacity, seed=0)
    import importlib.util
    import logging

    logging.getLogger("torchrl").setLevel(logging.WARNING)  # one INFO line per allocation
    assert upstream is not None
    spec = importlib.util.spec_from_file_location("objectrl_upstream_experience_memory", upstream)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ReplayBuffer(torch.device("cpu"), torch.device("cpu"), capacity)


def child(
    library: str, capacity: int, rows: int, rounds: int, warmup: int, upstream: str | None, alternate: bool
) -> dict[str, Any]:
    """Time ``rounds`` rounds of reset + add_batch(rows) in this process; times in milliseconds.

    ``alternate``: odd rounds write the rollout with ``advantages`` and ``returns`` added, as PPO's learn
    step re-adds it (so every reset is followed by a write of another schema)."""
    torch.set_num_threads(1)
    batch = rollout(rows)
    learn = batch.clone()
    learn["advantages"], learn["returns"] = torch.randn(rows), torch.randn(rows)
    rb = make_buffer(library, capacity, upstream)
    rb.add_batch(batch)  # the buffer as PPO holds it before its first reset
    resets, adds = [], []
    for i in range(warmup + rounds):
        data = learn if alternate and i % 2 == 0 else batch
        t0 = time.perf_counter()
        rb.reset()
        t1 = time.perf_counter()
        rb.add_batch(data)
        t2 = time.perf_counter()
        if i >= warmup:
            resets.append((t1 - t0) * 1e3)
            adds.append((t2 - t1) * 1e3)
    assert len(rb) == rows
    if hasattr(rb, "close"):
        rb.close()
    return {"reset": resets, "add_batch": adds}


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="1000000,4096", help="comma-separated buffer sizes")
    ap.add_argument("--rows", type=int, default=2048, help="rows per add_batch (a PPO rollout)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("-l", "--libraries", default=",".join(LIBRARIES))
    ap.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "objectrl_buffer_bench"))
    ap.add_argument("--objectrl-wheel", help="use this ObjectRL 0.2.1 wheel instead of downloading it")
    ap.add_argument("--no-download", action="store_true", help="never run pip download for the ObjectRL wheel")
    ap.add_argument("--child", nargs=3, metavar=("LIBRARY", "CAPACITY", "PATTERN"), help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        if (HERE.parent / "objectrl_buffer").is_dir():  # measure the checkout this script belongs to
            sys.path.insert(0, str(HERE.parent))
        library, capacity, pattern = args.child
        out = child(library, int(capacity), args.rows, args.rounds, args.warmup, args.upstream, pattern == "ppo")
        print(json.dumps(out))
        return 0

    sys.path.insert(0, str(HERE))
    from peers import Unsupported, upstream_module_path

    capacities = [int(c) for c in args.capacities.split(",")]
    libraries = args.libraries.split(",")
    upstream, notes = None, []
    if "objectrl" in libraries:
        try:
            upstream = upstream_module_path(args.cache_dir, args.objectrl_wheel, download=not args.no_download)
        except Unsupported as exc:
            libraries.remove("objectrl")
            notes.append(f"- ObjectRL 0.2.1: {exc}")
    results: dict[tuple[str, int, str], dict[str, list[float]]] = {}
    for capacity, pattern, library in itertools.product(capacities, PATTERNS, libraries):
        cmd = [sys.executable, __file__, "--child", library, str(capacity), pattern, "--rows", str(args.rows)]
        cmd += ["--rounds", str(args.rounds), "--warmup", str(args.warmup)]
        if upstream:
            cmd += ["--upstream", upstream]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            notes.append(f"- {LIBRARIES[library]} at {capacity}: failed: {proc.stderr.strip()[-300:]}")
            continue
        results[library, capacity, pattern] = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = [
        f"reset + add_batch({args.rows}) of an ObjectRL PPO rollout; ms, median (90th percentile) of "
        f"{args.rounds} rounds",
        "",
        "| buffer_size | schema after reset | step | " + " | ".join(LIBRARIES[lib] for lib in libraries) + " |",
        "|---|---|---|" + "---|" * len(libraries),
    ]
    for capacity, pattern in itertools.product(capacities, PATTERNS):
        for step in ("reset", "add_batch", "total"):
            cells = []
            for lib in libraries:
                got = results.get((lib, capacity, pattern))
                if got is None:
                    cells.append("n/a")
                    continue
                values = (
                    [a + b for a, b in zip(got["reset"], got["add_batch"], strict=True)]
                    if step == "total"
                    else got[step]
                )
                cells.append(f"{statistics.median(values):.2f} ({_q(values, 0.9):.2f})")
            label = {"reset": "reset()", "add_batch": f"add_batch({args.rows})", "total": "both"}[step]
            lines.append(f"| {capacity:,} | {PATTERNS[pattern]} | {label} | " + " | ".join(cells) + " |")
    print("\n".join(lines + (["", *notes] if notes else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
