"""Full-data checkpoint cost: ``save(path, data=True)`` against a raw write + fsync of the same bytes, and load time.

Workload: a MuJoCo-like buffer (HalfCheetah sizes) of ``--rows`` transitions, full:
state[17] f32, action[6] f32, reward f32, next_state[17] f32, terminated bool, truncated bool, step i64
(174 bytes per row, 174 MB for 1M rows), stored on CPU (memmap files under ``--dir``).

Baselines, each repeated ``--repeat`` times interleaved with the saves, median reported:
* raw, one file: every column's bytes written to a single file, one fsync.
* raw, per column: one file per column, each fsynced (the same file layout a save produces).
Loads are timed warm (checkpoint in the page cache) and cold (its pages evicted with
``posix_fadvise(DONTNEED)`` first, so they are read from the disk), with and without checksum checks.

Run:  python benchmarks/checkpoint_bench.py --rows 1000000 --dir /tmp/ckpt-bench
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import wait_for_cleanup

FIELDS = {
    "state": ((17,), torch.float32),
    "action": ((6,), torch.float32),
    "reward": ((), torch.float32),
    "next_state": ((17,), torch.float32),
    "terminated": ((), torch.bool),
    "truncated": ((), torch.bool),
    "step": ((), torch.int64),
}


def fill(rb: ReplayBuffer, rows: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for start in range(0, rows, 100_000):
        n = min(100_000, rows - start)
        batch = {}
        for key, (shape, dtype) in FIELDS.items():
            if dtype == torch.bool:
                batch[key] = torch.rand((n, *shape), generator=g) < 0.01
            elif dtype == torch.int64:
                batch[key] = torch.arange(start, start + n)
            else:
                batch[key] = torch.randn((n, *shape), generator=g, dtype=dtype)
        rb.add_batch(batch)


def raw_write(columns: list[torch.Tensor], folder: str, per_column: bool) -> None:
    os.makedirs(folder)
    fd = -1
    for i, column in enumerate(columns):
        if per_column or fd < 0:
            fd = os.open(os.path.join(folder, f"{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        view = column.reshape(-1).view(torch.uint8).numpy().data
        for start in range(0, len(view), 64 << 20):
            chunk = view[start : start + (64 << 20)]
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
        if per_column or i == len(columns) - 1:
            os.fsync(fd)
            os.close(fd)
    dfd = os.open(folder, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def evict(folder: str) -> None:
    """Drop the (clean, fsynced) pages of every file under ``folder`` from the page cache."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes, started from a quiet disk (no pending cleanup, nothing dirty)."""
    wait_for_cleanup()
    os.sync()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="work folder on the disk to measure (default: a temp folder)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    try:
        rb = ReplayBuffer("cpu", "cpu", args.rows, seed=0, storage_dir=os.path.join(work, "storage"))
        fill(rb, args.rows)
        assert rb.schema is not None
        columns = [rb.engine.storage.columns[f.key][: len(rb)] for f in rb.schema.fields]
        nbytes = sum(c.numel() * c.element_size() for c in columns)
        path = os.path.join(work, "ckpt", "run")
        os.makedirs(os.path.dirname(path))
        times: dict[str, list[float]] = {"raw one file": [], "raw per column": [], "save(data=True)": []}
        order = random.Random(0)
        for r in range(args.repeat):
            runs = [
                ("raw one file", lambda r=r: raw_write(columns, os.path.join(work, f"raw1-{r}"), False)),
                ("raw per column", lambda r=r: raw_write(columns, os.path.join(work, f"rawc-{r}"), True)),
                ("save(data=True)", lambda: rb.save(path, data=True, progress=False)),
            ]
            order.shuffle(runs)  # no systematic advantage from going first or last
            for name, fn in runs:
                times[name].append(timed(fn))
                for raw in glob.glob(os.path.join(work, "raw*")):
                    shutil.rmtree(raw)
        target = ReplayBuffer("cpu", "cpu", args.rows, storage_dir=os.path.join(work, "storage2"))
        for verify in (True, False):
            for cold in (False, True):
                name = f"load({'cold' if cold else 'warm'}, verify={verify})"
                times[name] = []
                for _ in range(args.repeat):
                    if cold:
                        evict(os.path.dirname(path))
                    times[name].append(timed(lambda v=verify: target.load(path, verify=v, progress=False)))
        assert torch.equal(target.sample_all()["state"], rb.sample_all()["state"])
        print(f"{args.rows} rows, {nbytes / 1e6:.1f} MB of columns; {args.repeat} runs each: median (min..max)")
        base = statistics.median(times["raw one file"])
        for name, values in times.items():
            med = statistics.median(values)
            print(
                f"  {name:26s} {med * 1e3:7.1f} ms ({min(values) * 1e3:6.1f}..{max(values) * 1e3:6.1f})"
                f"  {nbytes / med / 1e9:5.2f} GB/s  {med / base:5.2f}x raw one file"
            )
        # Runs of one repeat are back to back: their ratio cancels slow phases of a shared machine.
        for raw in ("raw one file", "raw per column"):
            pairs = [s / r for s, r in zip(times["save(data=True)"], times[raw], strict=True)]
            print(f"  save / {raw}, paired per repeat: median {statistics.median(pairs):.2f}x, min {min(pairs):.2f}x")
        rb.close()
        target.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
