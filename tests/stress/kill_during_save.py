"""Kill -9 a process while it saves a buffer of a few hundred MB, again and again, to one path.

After every kill, ``ReplayBuffer.from_checkpoint(path)`` (checksums verified) must give a *complete*
checkpoint: exactly the rows, counters and pointer some earlier finished ``save`` wrote, never a mix of two
saves, never garbage. Every row carries its own number (``step`` = child id << 40 | row number) and
values derived from it in every column, so a checkpoint tells which save it came from and whether each
slot holds what that save had there.

Each saver child (forked from a forkserver that has imported torch once, so a kill costs no import)
fills a buffer, then loops ``save(path, data=True)``; ``add_batch(next rows)``. The parent SIGKILLs it at
a random moment (during its first save, or after it), checks the checkpoint, and starts the next child
on the same path. At the end a child saves once and exits normally: exactly one data generation may
remain, and no temp files.

    python tests/stress/kill_during_save.py --kills 120     # the 100+ run (~2-4 s per kill on 2 cores)

The test suite runs the same code with 22 kills (tests/test_crash_safety.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import wait_for_cleanup

SHIFT = 40  # step = child << SHIFT | row number
GENERATION = re.compile(r"run\.data-[0-9a-f]{16}")


def transitions(child: int, first: int, n: int, frame_bytes: int) -> dict[str, torch.Tensor]:
    ids = (child << SHIFT) | torch.arange(first, first + n, dtype=torch.int64)
    return {
        "step": ids,
        "value": ids.to(torch.float64) * 0.5,
        "frame": (ids % 251).to(torch.uint8).unsqueeze(1).expand(n, frame_bytes),  # copied once, into storage
    }


def saver(
    path: str,
    storage_dir: str,
    child: int,
    capacity: int,
    batch: int,
    frame_bytes: int,
    saves: int,
    ready: Any = None,
    saved: Any = None,
) -> None:
    """Fill a buffer, set ``ready``, then save and add ``batch`` new rows, ``saves`` times (-1: until killed).

    ``saved`` (a shared int) counts the saves that returned.
    """
    torch.set_num_threads(1)
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=child, storage_dir=storage_dir)
    added = 0
    while added < capacity:
        rb.add_batch(transitions(child, added, batch, frame_bytes))
        added += batch
    if ready is not None:
        ready.set()
    done = 0
    while done != saves:
        rb.save(path, data=True)
        done += 1
        if saved is not None:
            saved.value = done
        rb.add_batch(transitions(child, added, batch, frame_bytes))
        added += batch
    wait_for_cleanup()


def check(path: str, storage_dir: str, capacity: int, batch: int) -> tuple[int, int]:
    """Load the checkpoint and prove it is one complete save: return (child, rows that save had added)."""
    rb = ReplayBuffer.from_checkpoint(path, storage_dir=storage_dir)
    try:
        assert (len(rb), rb.buffer_size) == (capacity, capacity), f"size {len(rb)}/{rb.buffer_size}"
        newest = int(rb.sample_by_index_fields([(rb.pointer - 1) % capacity], "step")["step"][0])
        child, total = newest >> SHIFT, (newest & ((1 << SHIFT) - 1)) + 1
        assert total % batch == 0 and total >= capacity, f"newest row {total - 1} is not the end of a save"
        assert rb.pointer == total % capacity, f"pointer {rb.pointer} but {total} rows were added"
        slots = torch.arange(capacity)
        ids = (child << SHIFT) | (
            total - capacity + (slots - total) % capacity
        )  # what each slot holds after `total` adds
        got = rb.sample_by_index_fields(slots, ["step", "value"])
        assert torch.equal(got["step"], ids), "slots hold rows of another save"
        assert torch.equal(got["value"], ids.to(torch.float64) * 0.5), "the value column is from another save"
        # Frames (the bulk, crc-checked by the load) at 64 random slots plus the newest and the oldest row.
        some = torch.cat([torch.randint(0, capacity, (64,)), torch.tensor([rb.pointer - 1, rb.pointer]) % capacity])
        frames = rb.sample_by_index_fields(some, "frame")["frame"]
        assert bool((frames == (ids[some] % 251).to(torch.uint8).unsqueeze(1)).all()), "frames from another save"
        return child, total
    finally:
        rb.close()


def leftovers(folder: str) -> tuple[list[str], list[str]]:
    """Generation folders and metadata temp files of ``run`` in ``folder``."""
    names = sorted(os.listdir(folder))
    return [n for n in names if GENERATION.fullmatch(n)], [n for n in names if n.endswith(".tmp")]


def run_kills(
    kills: int,
    workdir: str,
    capacity: int = 2048,
    batch: int = 256,
    frame_bytes: int = 96 * 1024,
    seed: int = 0,
    log: Any = None,
) -> dict[str, Any]:
    """Run ``kills`` SIGKILL rounds; raise AssertionError on the first incomplete checkpoint; return stats.

    Half the kills come ``uniform(0, T)`` seconds after the saver filled its buffer (inside its first
    save, mostly), the other half ``uniform(0, T)`` seconds after its first save returned (in the add,
    the second save, or the cleanup of the first), where ``T`` is the duration of the last save seen.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["objectrl_buffer", __name__])
    rng = random.Random(seed)
    folder = os.path.join(workdir, "ckpt")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "run")
    child_storage, check_storage = os.path.join(workdir, "child-storage"), os.path.join(workdir, "check-storage")
    stats: Counter[str] = Counter()
    seen: set[str] = set()
    last: tuple[int, int] | None = None
    start = time.perf_counter()
    ready, saved = ctx.Event(), ctx.Value("i", 0, lock=False)
    save_seconds: list[float] = []
    for child in range(kills):
        ready.clear()
        saved.value = 0
        args = (path, child_storage, child, capacity, batch, frame_bytes, -1, ready, saved)
        proc = ctx.Process(target=saver, args=args, daemon=True)
        proc.start()
        assert ready.wait(300), f"saver {child} did not fill its buffer"
        if last is None or rng.random() < 0.5:  # the first saver must finish a save: something to keep
            began = time.perf_counter()
            while saved.value < 1 and proc.is_alive():
                time.sleep(0.002)
            save_seconds.append(time.perf_counter() - began)
            stats["kills after a completed save"] += 1
        time.sleep(rng.uniform(0.0, save_seconds[-1]))
        proc.kill()
        proc.join()
        assert proc.exitcode == -9, f"saver {child} exited with {proc.exitcode} before the kill"
        generations, temps = leftovers(folder)
        got = check(path, check_storage, capacity, batch)
        assert got[0] == child or got == last, f"kill {child}: a checkpoint of saver {got[0]} appeared from nowhere"
        stats["load gave the previous saver's checkpoint" if got == last else "load gave this saver's checkpoint"] += 1
        referenced = torch.load(path + ".metadata", weights_only=True)["data_dir"]
        for name in set(generations) - seen - {referenced}:  # left unreferenced by this saver's kill
            if os.path.exists(os.path.join(folder, name, "manifest.json")):
                stats["left a complete unreferenced data folder (before the metadata switch, or cleanup pending)"] += 1
            else:
                stats["left a partial data folder (killed while writing it, or while removing an old one)"] += 1
        seen.update(generations)
        if temps:
            stats["left a metadata temp file (killed while writing the metadata)"] += 1
        if log is not None:
            print(f"kill {child + 1}/{kills}: checkpoint of saver {got[0]} with {got[1]} rows", file=log)
        last = got
    final = ctx.Process(target=saver, args=(path, child_storage, kills, capacity, batch, frame_bytes, 1))
    final.start()
    final.join()
    assert final.exitcode == 0, f"the final saver failed with exit code {final.exitcode}"
    assert check(path, check_storage, capacity, batch) == (kills, capacity)
    generations, temps = leftovers(folder)
    assert len(generations) == 1 and not temps, f"left after a clean save: {generations} {temps}"
    stats["kills"] = kills
    stats["seconds"] = round(time.perf_counter() - start, 1)
    stats["checkpoint MB"] = round(capacity * (frame_bytes + 16) / 1e6, 1)
    stats["median save seconds"] = round(sorted(save_seconds)[len(save_seconds) // 2], 2)
    return dict(stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=120)
    parser.add_argument("--capacity", type=int, default=2048)
    parser.add_argument("--frame-bytes", type=int, default=96 * 1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="work folder (default: a temp folder, removed at the end)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kill-during-save-", dir=args.dir) as work:
        stats = run_kills(args.kills, work, args.capacity, 256, args.frame_bytes, args.seed, log=sys.stdout)
    for key, value in stats.items():
        print(f"{key}: {value}")
    print(f"PASS: every one of {args.kills} kills left a complete checkpoint")


if __name__ == "__main__":
    main()
