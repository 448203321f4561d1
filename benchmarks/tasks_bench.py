"""objectrl_buffer.tasks vs AWorld 0.2.6's replay buffer (loaded from its wheel at run time): store, queries,
sample_task, and 4 writer processes. Prints a markdown table; ratios are upstream time / our time per row or
per call (higher is better for us).

    .venv/bin/python benchmarks/tasks_bench.py [--rows 100000] [--big 1000000] [--only store] [--cache-dir DIR]

Upstream's stores are quadratic (``InMemoryStorage.add`` calls ``size()``, which lists every row; the
multi-process ``add`` unpickles every task), so they are timed on fewer rows and compared per row; its
queries are timed on the same rows as ours (its storage filled directly, bypassing the quadratic add).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.aworld_upstream import DEFAULT_CACHE, load
from objectrl_buffer.tasks import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    SharedTaskStorage,
    TaskReplayBuffer,
)

TWO_LEAF = QueryBuilder().eq("exp_meta.agent_id", "agent_3").and_().gte("exp_meta.step", 5)
NESTED = (
    QueryBuilder()
    .eq("exp_meta.task_name", "name_1")
    .and_()
    .nested(QueryBuilder().eq("exp_meta.agent_id", "agent_1").or_().lt("exp_meta.step", 2))
)


def rows_of(mod: Any, n: int, first: int = 0, steps: int = 10, writer: int = 0) -> list[Any]:
    """``n`` rows of tasks of ``steps`` steps; ``mod`` supplies DataRow/ExpMeta/Experience (ours or upstream's)."""
    out = []
    for i in range(first, first + n):
        task = i // steps
        meta = mod.ExpMeta(f"w{writer}-task_{task}", f"name_{task % 5}", f"agent_{task % 8}", i % steps, float(i), None)
        data = mod.Experience(
            {"obs": f"observation {i}"}, [{"tool": "search", "args": {"q": i}}], 0.5, None, None, None
        )
        out.append(mod.DataRow(meta, data))
    return out


WORKLOADS = ("store", "query", "sample_task", "writers")


class Ours:
    DataRow, ExpMeta, Experience = DataRow, ExpMeta, Experience


def best(fn: Callable[[], Any], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _ours_writer(storage: SharedTaskStorage, writer: int, n: int) -> None:
    rows = rows_of(Ours, n, writer=writer)
    for i in range(0, n, 1000):
        storage.add_batch(rows[i : i + 1000])


def _upstream_writer(storage: Any, writer: int, n: int, cache: str) -> None:
    mods = load(cache)
    for r in rows_of(mods["base"], n, writer=writer):
        storage.add(r)


def four_writers(target: Callable[..., None], storage: Any, n: int, *extra: Any) -> float:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(storage, w, n, *extra)) for w in range(4)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=1_000_000, help="rows of the large query run (0: skip)")
    parser.add_argument("--upstream-store-rows", type=int, default=20_000)
    parser.add_argument("--upstream-writer-rows", type=int, default=100, help="rows per upstream writer process")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (upstream is single-threaded Python)")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="run only these workloads (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="store: best of this many runs (ours and upstream)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mods = load(args.cache_dir)
    base = mods["base"]
    table: list[tuple[str, str, float, float]] = []  # workload, unit, ours, upstream
    run = set(args.only or WORKLOADS)
    rows = rows_of(Ours, args.rows)

    if "store" in run:  # batches of 1000
        ours = best(lambda: _store(rows, args.rows), args.repeat)
        up_rows = rows_of(base, args.upstream_store_rows)
        up = best(lambda: _store_upstream(base, up_rows), args.repeat)
        table.append((f"store {args.rows} rows, batches of 1000", "µs/row", ours / args.rows, up / len(up_rows)))

    # queries over the same rows
    for n in ([args.rows] + ([args.big] if args.big else [])) if "query" in run else []:
        storage = InMemoryStorage(n)
        big_rows = rows if n == args.rows else rows_of(Ours, n)
        for i in range(0, n, 10_000):
            storage.add_batch(big_rows[i : i + 10_000])
        up_storage = base.InMemoryStorage(n)
        up_storage._data = {}
        for r in rows_of(base, n):
            up_storage._data.setdefault(r.exp_meta.task_id, []).append(r)
        for name, q in (("two-leaf", TWO_LEAF.build()), ("nested", NESTED.build())):
            assert storage.size(q) == up_storage.size(q)
            if name == "two-leaf":  # rows are built on first read: this call builds its rows, later ones reuse them
                first = best(functools.partial(storage.get_all, q), 1)
                u = best(functools.partial(up_storage.get_all, q), 1)
                table.append((f"get_all({name} query) at {n} rows, first call", "ms/call", first * 1e3, u * 1e3))
            for call in ("size", "get_all"):
                o = best(functools.partial(getattr(storage, call), q))
                u = best(functools.partial(getattr(up_storage, call), q), 1)
                table.append((f"{call}({name} query) at {n} rows", "ms/call", o * 1e3, u * 1e3))

    if "sample_task" in run:
        table.append(_sample_task(base, rows, args.rows))
    if "writers" in run:
        table.append(_writers(mods, args))
    _print(table)


def _sample_task(base: Any, rows: list[Any], n: int) -> tuple[str, str, float, float]:
    """sample_task(32) over n // 10 tasks (n rows)."""
    rb = TaskReplayBuffer(InMemoryStorage(n), seed=0)
    rb.store_batch(rows)
    up_rb = base.ReplayBuffer(base.InMemoryStorage(n))
    up_rb._storage._data = {}
    for r in rows_of(base, n):
        up_rb._storage._data.setdefault(r.exp_meta.task_id, []).append(r)
    o = best(lambda: rb.sample_task(batch_size=32))
    u = best(lambda: up_rb.sample_task(sampler=base.RandomTaskSample(), batch_size=32), 1)
    return (f"sample_task(32) over {n // 10} tasks", "ms/call", o * 1e3, u * 1e3)


def _writers(mods: dict[str, Any], args: argparse.Namespace) -> tuple[str, str, float, float]:
    """4 writer processes, args.rows // 4 rows each (upstream: args.upstream_writer_rows each)."""
    per = args.rows // 4
    with tempfile.TemporaryDirectory() as folder:
        shared = SharedTaskStorage(max_capacity=args.rows, path=folder)
        o = four_writers(_ours_writer, shared, per)
        assert len(shared) == 4 * per
    manager = multiprocessing.Manager()
    up_shared = mods["multi_proc_mem"].MultiProcMemoryStorage(
        manager.dict(), manager.list(), manager.Lock(), max_capacity=args.rows
    )
    u = four_writers(_upstream_writer, up_shared, args.upstream_writer_rows, args.cache_dir)
    for task_id in list(up_shared._data.keys()):
        up_shared._delete_from_shared_memory(task_id)
    manager.shutdown()
    return (
        f"4 writer processes, {per} rows each",
        "µs/row",
        o / (4 * per) * 1e6,
        u / (4 * args.upstream_writer_rows) * 1e6,
    )


def _print(table: list[tuple[str, str, float, float]]) -> None:
    print("| workload | unit | objectrl_buffer.tasks | AWorld 0.2.6 | speed-up |\n|---|---|---|---|---|")
    for label, unit, ours_t, up_t in table:
        scale = 1e6 if unit == "µs/row" and ours_t < 1e-3 else 1.0
        print(f"| {label} | {unit} | {ours_t * scale:.3g} | {up_t * scale:.3g} | {up_t / ours_t:.1f}x |")


def _store(rows: list[Any], capacity: int) -> None:
    storage = InMemoryStorage(capacity)
    for i in range(0, len(rows), 1000):
        storage.add_batch(rows[i : i + 1000])


def _store_upstream(base: Any, rows: list[Any]) -> None:
    storage = base.InMemoryStorage(10 * len(rows))
    for i in range(0, len(rows), 1000):
        storage.add_batch(rows[i : i + 1000])


if __name__ == "__main__":
    main()
