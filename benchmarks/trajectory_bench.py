"""Trajectory buffer: objectrl_buffer.trajectory vs rlinf 0.3.0's TrajectoryReplayBuffer (from its wheel, at run time).

Workloads (issue 14), each timed ``--rounds`` times, median reported with the spread:

* add: ``--trajectories`` calls of ``add_trajectories([one [T, B] trajectory])`` with obs ``[32]`` and image obs
  ``uint8[3, S, S]``, without and with saving (with: the add calls alone, and add + waiting until the files
  are durable: ours fsyncs them before its index names them; rlinf's are fsynced once its writer is done).
  Without saving both keep the newest 100 (the window); a second row has both keep every trajectory.
* sample(256) from a window of 100 trajectories, RLinf's cache on (``cache_size=100``) and off (its misses
  read trajectory files; ours never reads files).
* load_checkpoint of ``--load-trajectories`` trajectories (obs only) sharded over 4 ranks: the 4 loads in turn.
* merge of 4 rank folders: ours against copying the same files with ``shutil.copy2`` (the limit; RLinf's
  merge script is not in its wheel).

    python benchmarks/trajectory_bench.py                 # the issue's sizes (needs ~8 GB RAM, ~6 GB disk)
    python benchmarks/trajectory_bench.py --quick         # small sizes, seconds
    python benchmarks/trajectory_bench.py --clock cpu     # CPU time instead of wall time (a loaded box)

Both peers run in one process with ``torch.set_num_threads(--threads)`` (1 by default, as ``bench.py``).
Ratios are rlinf's time / ours (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rlinf_peer
from objectrl_buffer.trajectory import TrajectoryReplayBuffer, merge_rank_folders

MERGE = "merge 4 rank folders (rlinf col: plain copy2)"
KEEP_ALL = "add, no save, every trajectory kept (ours: window 0; rlinf: window = adds)"


def make_pool(n: int, T: int, B: int, image: int, seed: int = 0) -> list[Any]:
    """``n`` distinct trajectories (cycled through by the adds), as RLinf code makes them: objects of RLinf's
    own ``Trajectory`` class (the peer's stand-in, not ours), which both buffers take as they are."""
    g = torch.Generator().manual_seed(seed)
    pool = []
    for i in range(n):
        obs: dict[str, torch.Tensor] = {"state": torch.randn(T, B, 32, generator=g)}
        if image:
            obs["image"] = torch.randint(0, 256, (T, B, 3, image, image), generator=g, dtype=torch.uint8)
        pool.append(
            rlinf_peer.RLINF_TRAJECTORY(
                max_episode_length=T,
                model_weights_id=f"w{i}_0",
                actions=torch.randn(T, B, 7, generator=g),
                rewards=torch.randn(T, B, generator=g),
                dones=torch.zeros(T, B, dtype=torch.bool),
                prev_logprobs=torch.randn(T, B, generator=g),
                prev_values=torch.randn(T, B, generator=g),
                curr_obs=obs,
                next_obs={"state": torch.randn(T, B, 32, generator=g)},
            )
        )
    return pool


#: What :func:`timed` reads: ``time.perf_counter`` (wall, the default) or, with ``--clock cpu``,
#: ``time.process_time`` (CPU seconds of every thread of this process: steadier than wall time on a
#: shared box, where other work takes the cores; for the saving rows it also counts the writer threads).
CLOCK: Callable[[], float] = time.perf_counter


def timed(fn: Callable[[], Any]) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


class Rounds:
    """Seconds per (workload, peer) over rounds."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, str], list[float]] = {}
        self.units: dict[str, tuple[str, float]] = {}  # workload -> (unit, work per run)

    def add(self, workload: str, peer: str, seconds: float, unit: str, work: float) -> None:
        self.times.setdefault((workload, peer), []).append(seconds)
        self.units[workload] = (unit, work)

    def table(self, peers: list[str]) -> str:
        lines = [
            "| workload | unit | " + " | ".join(peers) + " | ratio (rlinf / ours) |",
            "|---" * (len(peers) + 3) + "|",
        ]
        for workload, (unit, work) in self.units.items():
            cells = []
            medians = {}
            for peer in peers:
                ts = self.times.get((workload, peer))
                if not ts:
                    cells.append("n/a")
                    continue
                med = statistics.median(ts)
                medians[peer] = med
                cells.append(f"{work / med:,.1f} ({work / max(ts):,.1f}-{work / min(ts):,.1f})")
            ratio = medians[peers[1]] / medians[peers[0]] if len(medians) == 2 else float("nan")
            lines.append(f"| {workload} | {unit} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
        return "\n".join(lines)


def fsync_folder(folder: str) -> None:
    """fsync every file of ``folder``, then the folder: what rlinf's writer leaves in the page cache, on disk."""
    for entry in os.scandir(folder):
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def add_all(buffer: Any, adds: list[Any]) -> None:
    for trajectory in adds:
        buffer.add_trajectories([trajectory])


def sample_n(buffer: Any, calls: int) -> None:
    for _ in range(calls):
        buffer.sample(256)


def one_round(args: argparse.Namespace, upstream: Any, rounds: Rounds, adds: list[Any], work: str, r: int) -> None:
    """Adds (without, then with saving) and samples (cache on, then off), ours and rlinf's."""
    n, calls, off = len(adds), args.sample_calls, args.sample_calls_off
    ours_dir, theirs_dir = os.path.join(work, f"ours{r}"), os.path.join(work, f"theirs{r}")
    # -- add without saving, window 100: both keep the newest 100; sample from memory (ours: storage, rlinf: cache)
    ours = TrajectoryReplayBuffer(seed=r, sample_window_size=100)
    theirs = upstream.TrajectoryReplayBuffer(seed=r, sample_window_size=100)
    rounds.add("add, no save", "ours", timed(lambda: add_all(ours, adds)), "traj/s", n)
    rounds.add("add, no save", "rlinf", timed(lambda: add_all(theirs, adds)), "traj/s", n)
    rounds.add("sample(256), cache on", "ours", timed(lambda: sample_n(ours, calls)), "calls/s", calls)
    theirs.close()
    ours.close()
    # -- both keep all 200: ours with sample_window_size=0 (every trajectory kept, in RAM-backed files), rlinf
    #    with a window of 200 (its cache is forced to the window without saving; 0 there is a modulo by zero)
    ours = TrajectoryReplayBuffer(seed=r, sample_window_size=0)
    theirs = upstream.TrajectoryReplayBuffer(seed=r, sample_window_size=n)
    rounds.add(KEEP_ALL, "ours", timed(lambda: add_all(ours, adds)), "traj/s", n)
    rounds.add(KEEP_ALL, "rlinf", timed(lambda: add_all(theirs, adds)), "traj/s", n)
    theirs.close()
    ours.close()
    # -- add with saving (rlinf: cache_size 100 covers the window of 100)
    ours = TrajectoryReplayBuffer(r, True, 100, ours_dir, "pt", 100, True)
    theirs = upstream.TrajectoryReplayBuffer(
        seed=r, enable_cache=True, cache_size=100, sample_window_size=100, auto_save=True, auto_save_path=theirs_dir
    )
    t_ours = timed(lambda: add_all(ours, adds))
    t_ours_disk = t_ours + timed(ours.flush)
    t_theirs = timed(lambda: add_all(theirs, adds))
    # until durable, like ours (whose writer fsyncs the files before an index names them): rlinf's writer
    # leaves its files in the page cache, so they are fsynced here once it is done
    t_theirs_disk = t_theirs + timed(lambda: (theirs._save_executor.shutdown(wait=True), fsync_folder(theirs_dir)))
    rounds.add("add, save (calls)", "ours", t_ours, "traj/s", n)
    rounds.add("add, save (calls)", "rlinf", t_theirs, "traj/s", n)
    rounds.add("add, save (until durable on disk)", "ours", t_ours_disk, "traj/s", n)
    rounds.add("add, save (until durable on disk)", "rlinf", t_theirs_disk, "traj/s", n)
    rounds.add("sample(256), cache on", "rlinf", timed(lambda: sample_n(theirs, calls)), "calls/s", calls)
    theirs.close()
    ours.close()
    # -- cache off: rlinf reads trajectory files on every call; ours reads its storage, as always
    ours = TrajectoryReplayBuffer(seed=r, enable_cache=False, sample_window_size=100)
    ours.load_checkpoint(ours_dir)
    rounds.add("sample(256), cache off", "ours", timed(lambda: sample_n(ours, off)), "calls/s", off)
    ours.close()
    theirs = upstream.TrajectoryReplayBuffer(
        seed=r, enable_cache=False, sample_window_size=100, auto_save=True, auto_save_path=theirs_dir
    )
    theirs.load_checkpoint(theirs_dir)
    rounds.add("sample(256), cache off", "rlinf", timed(lambda: sample_n(theirs, off)), "calls/s", off)
    theirs.close()
    shutil.rmtree(ours_dir)
    shutil.rmtree(theirs_dir)


def run(args: argparse.Namespace) -> str:
    upstream = rlinf_peer.load(args.cache_dir, download=not args.no_download)
    rounds = Rounds()
    pool = make_pool(args.pool, args.T, args.B, args.image)
    n = args.trajectories
    adds = [pool[i % len(pool)] for i in range(n)]
    rows = args.T * args.B
    work_dir = tempfile.mkdtemp(prefix="trajectory_bench_", dir=args.work_dir)
    try:
        for r in range(args.rounds):
            one_round(args, upstream, rounds, adds, work_dir, r)
        load_and_merge(args, upstream, rounds, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    header = (
        f"trajectories [T={args.T}, B={args.B}] = {rows} transitions, obs [32] + image "
        f"uint8[3,{args.image},{args.image}]; {n} adds, {args.rounds} rounds; "
        f"load/merge: {args.load_trajectories} obs-only trajectories; {args.clock} clock\n\n"
    )
    return header + rounds.table(["ours", "rlinf"])


def load_and_merge(args: argparse.Namespace, upstream: Any, rounds: Rounds, work_dir: str) -> None:
    """load_checkpoint of N trajectories over 4 ranks; merge of 4 rank folders (vs plain copies)."""
    n = args.load_trajectories
    pool = make_pool(min(n, args.pool), args.T, args.B, 0, seed=1)
    folder = os.path.join(work_dir, "ckpt")
    writer = TrajectoryReplayBuffer(seed=0)
    writer.add_trajectories([pool[i % len(pool)] for i in range(n)])
    writer.save_checkpoint(folder)
    writer.close()
    ranks = os.path.join(work_dir, "ranks")
    for rank in range(4):
        part = TrajectoryReplayBuffer(seed=0)
        part.load_checkpoint(folder, True, rank, 4)
        part.save_checkpoint(os.path.join(ranks, f"rank_{rank}"))
        part.close()
    for r in range(args.rounds):

        def load_ours() -> None:
            for rank in range(4):
                b = TrajectoryReplayBuffer(seed=0, sample_window_size=100)
                b.load_checkpoint(folder, True, rank, 4)
                b.close()

        def load_theirs() -> None:
            for rank in range(4):
                b = upstream.TrajectoryReplayBuffer(seed=0, sample_window_size=100)
                b.load_checkpoint(folder, True, rank, 4)
                b.close()

        rounds.add("load_checkpoint, 4 ranks", "ours", timed(load_ours), "traj/s", n)
        rounds.add("load_checkpoint, 4 ranks", "rlinf", timed(load_theirs), "traj/s", n)
        out = os.path.join(work_dir, f"merged{r}")
        rounds.add(MERGE, "ours", timed(partial(merge_rank_folders, ranks, out)), "traj/s", n)

        def plain_copy(target: str) -> None:
            os.makedirs(target)
            for rank in sorted(os.listdir(ranks)):
                for name in os.listdir(os.path.join(ranks, rank)):
                    shutil.copy2(os.path.join(ranks, rank, name), os.path.join(target, f"{rank}_{name}"))

        rounds.add(MERGE, "rlinf", timed(partial(plain_copy, os.path.join(work_dir, f"copy{r}"))), "traj/s", n)
        shutil.rmtree(out)
        shutil.rmtree(os.path.join(work_dir, f"copy{r}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--B", type=int, default=16)
    parser.add_argument("--image", type=int, default=64, help="image side (0: no image)")
    parser.add_argument("--pool", type=int, default=20, help="distinct trajectories cycled through by the adds")
    parser.add_argument("--load-trajectories", type=int, default=1000)
    parser.add_argument("--sample-calls", type=int, default=200)
    parser.add_argument("--sample-calls-off", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for both peers")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="what the timings read")
    parser.add_argument("--cache-dir", default=rlinf_peer.DEFAULT_CACHE)
    parser.add_argument("--no-download", action="store_true")
    parser.add_argument("--work-dir", default=None, help="where the folders are written (default: the temp folder)")
    parser.add_argument("-o", "--output", default=None, help="also write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # as bench.py: a contended 2-core machine makes torch's pool spin
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.trajectories, args.T, args.B, args.image, args.pool = 12, 8, 4, 16, 4
        args.load_trajectories, args.sample_calls, args.sample_calls_off, args.rounds = 40, 20, 2, 1
    table = run(args)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")


if __name__ == "__main__":
    main()
