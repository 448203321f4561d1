"""Pixel replay buffers side by side (issue 25): memory, add, sample(32) and checkpoints of Atari rows.

Rows as an Atari DQN writes them: ``state`` and ``next_state`` ``uint8[4,84,84]`` (4 stacked frames, newest
last; an episode starts with its first frame repeated 4 times, as gymnasium's ``FrameStackObservation``
does), ``action`` (int), ``reward`` (float), ``terminated`` (float, 1 at the last step of an episode: the key
by which our buffer knows where episodes end; the peers get it under their own name). Episodes
have lengths drawn uniformly from ``--episode-len`` (default 200-2000 steps, ~90 episodes in 100k rows),
so episode starts and ends, and the ring's wrap, are in the stream. Every peer gets the same stream.

The peers, each in its own child process (so no peer's memory, imports or caches count for another):

* ``compact``: ``objectrl_buffer.ReplayBuffer(..., next_of={"next_state": "state"}, frame_stack={"state": 4})``;
* ``plain``: ``objectrl_buffer.ReplayBuffer`` as it stores rows today (both stacks in full);
* ``sb3``: Stable-Baselines3 ``ReplayBuffer(optimize_memory_usage=True)`` (observations stored once, stacked);
* ``cpprb``: cpprb ``ReplayBuffer(next_of="obs", stack_compress="obs")`` (its stack axis is the last one,
  so it is given ``uint8[84,84,4]``, its native layout);
* ``torchrl``: torchrl ``ReplayBuffer`` with ``CatFrames`` in the buffer, from
  ``CatFrames.make_rb_transform_and_sampler`` (storage: one ``pixels`` frame and one ``("next", "pixels")``
  frame a row, ``LazyTensorStorage``; a ``SliceSampler`` of 4-row slices, stacked at sample time);
* ``floor``: a preallocated NumPy ``uint8`` array of the unique frames (one per step, one more per episode
  start) and index arithmetic (each row keeps the index of its newest frame and of its episode's first
  frame); a sample gathers ``[32, 4]`` frame indices for ``state`` and for ``next_state``.

Measured per peer: bytes per stored row by the peer's own count (``nbytes`` for ours, the arrays' sizes for
the others; cpprb has no such count: its RSS is given) and the resident memory the full buffer added to
the process (RssAnon + RssFile + RssShmem from ``/proc/self/status``, after minus before, after the ring
wrapped); per-step add (the add call alone, timed in blocks, after the ring is full: the steady state);
``sample(32)``; for ours and the floor, save with data and load of the full buffer (ours: ``save(path,
data=True)`` and ``ReplayBuffer.load`` into a fresh buffer, crc32 checked; the floor: raw column files,
fsynced, read back), and the checkpoint's size on disk. Ratios: memory against the unique-frame bytes
(``7056`` bytes, one 84x84 frame, per row), times against the floor and against our plain buffer.

    python benchmarks/pixel_bench.py                          # 100k rows, all peers (several minutes)
    python benchmarks/pixel_bench.py --rows 20000 -p compact,plain,floor
    python benchmarks/pixel_bench.py --quick                  # smoke run: 2000 rows
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
FRAME = (84, 84)
FRAME_BYTES = 84 * 84
STACK = 4
PEERS = ["compact", "plain", "sb3", "cpprb", "torchrl", "floor"]
TITLES = {
    "compact": "objectrl_buffer compact",
    "plain": "objectrl_buffer plain",
    "sb3": "SB3 optimize_memory_usage",
    "cpprb": "cpprb next_of + stack_compress",
    "torchrl": "torchrl CatFrames in buffer",
    "floor": "NumPy floor (unique frames)",
}
POOL = 509  # distinct random frames the stream cycles through (content does not matter: nothing compresses)


class Unsupported(Exception):
    """A peer that is not installed (or lacks the API): its column is skipped with this note."""


# ---------------------------------------------------------------------------- the stream
class Row:
    """One transition: frame indices of the two stacks (into the frame pool), and the scalars."""

    __slots__ = ("action", "done", "episode", "first", "frame", "next_frames", "reward", "state_frames")

    def __init__(self, state_frames: list[int], next_frames: list[int], action: int, reward: float, done: bool,
                 episode: int, frame: int, first: int) -> None:  # fmt: skip
        self.state_frames, self.next_frames = state_frames, next_frames
        self.action, self.reward, self.done = action, reward, done
        self.episode, self.frame, self.first = episode, frame, first


def stream(steps: int, seed: int, episode_len: tuple[int, int]) -> Iterator[Row]:
    """``steps`` transitions of episodes whose lengths are uniform in ``episode_len``.

    Frames are numbered globally (``frame``: the newest frame of ``state``; ``first``: the episode's first
    frame); the pixels of frame ``g`` are ``pool[g % POOL]``. ``next_frames`` ends with frame ``frame + 1``.
    """
    rng = np.random.default_rng(seed)
    g, episode = 0, 0
    while True:
        length = int(rng.integers(episode_len[0], episode_len[1] + 1))
        first = g
        for t in range(length):
            state = [first + max(t - k, 0) for k in range(STACK - 1, -1, -1)]
            nxt = [first + max(t + 1 - k, 0) for k in range(STACK - 1, -1, -1)]
            done = t == length - 1
            yield Row(state, nxt, int(rng.integers(6)), float(rng.random() < 0.05), done, episode, first + t, first)
            steps -= 1
            if steps == 0:
                return
        g = first + length + 1  # the episode's frames were first .. first + length
        episode += 1


def unique_frames(newest: np.ndarray, first: np.ndarray) -> int:
    """Distinct frames the stored rows show: each row's newest ``state`` frame and the frame after it, and
    its episode's first frame (``newest``/``first``: the rows' global frame numbers)."""
    return len(np.union1d(np.union1d(newest, newest + 1), first))


# ---------------------------------------------------------------------------- the peers
class Peer:
    """One library's buffer of pixel rows. ``add`` gets the native item ``make_item`` built (untimed)."""

    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        self.capacity, self.pool, self.tmp = capacity, pool, tmp

    def stack(self, frames: list[int]) -> np.ndarray:
        return self.pool[np.asarray(frames) % POOL]  # uint8[4, 84, 84], a new array as a frame-stack wrapper makes

    def make_item(self, r: Row) -> Any:
        return {"state": self.stack(r.state_frames), "next_state": self.stack(r.next_frames),
                "action": r.action, "reward": r.reward, "terminated": float(r.done)}  # fmt: skip

    def add(self, item: Any) -> None:
        raise NotImplementedError

    def sample(self, k: int) -> Any:
        raise NotImplementedError

    def own_bytes(self) -> float | None:
        """Bytes the stored rows take, by the library's own count (``None``: it has none)."""
        return None

    def save(self, path: str) -> None:
        raise Unsupported("not measured")

    def load(self, path: str) -> None:
        raise Unsupported("not measured")


class Ours(Peer):
    compact = False

    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        super().__init__(capacity, pool, tmp)
        self.rb = self.build()

    def build(self) -> Any:
        from objectrl_buffer import ReplayBuffer

        extra: dict[str, Any] = {}
        if self.compact:
            extra = {"next_of": {"next_state": "state"}, "frame_stack": {"state": STACK}}
        return ReplayBuffer("cpu", "cpu", self.capacity, seed=0, **extra)

    def add(self, item: Any) -> None:
        self.rb.add(item)

    def sample(self, k: int) -> Any:
        return self.rb.sample_batch(k)

    def own_bytes(self) -> float | None:
        nbytes = getattr(self.rb, "nbytes", None)
        if nbytes is None:  # a checkout without the compact storage: the columns' bytes
            cols = self.rb.engine.storage.columns.values()
            nbytes = sum(c.numel() * c.element_size() for c in cols)
        return float(nbytes)

    def save(self, path: str) -> None:
        self.rb.save(path, data=True, progress=False)

    def load(self, path: str) -> None:
        self.rb.close()  # the loaded copy takes its place: never two full buffers at once
        rb = self.build()
        rb.load(path, progress=False)
        self.rb = rb


class Compact(Ours):
    compact = True


class SB3(Peer):
    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        super().__init__(capacity, pool, tmp)
        try:
            from gymnasium import spaces
            from stable_baselines3.common.buffers import ReplayBuffer
        except ImportError as exc:
            raise Unsupported(f"stable-baselines3 not installed ({exc.name})") from None
        obs = spaces.Box(0, 255, (STACK, *FRAME), np.uint8)
        self.rb = ReplayBuffer(capacity, obs, spaces.Discrete(6), device="cpu", n_envs=1,
                               optimize_memory_usage=True, handle_timeout_termination=False)  # fmt: skip

    def make_item(self, r: Row) -> Any:
        s, n = self.stack(r.state_frames)[None], self.stack(r.next_frames)[None]
        return s, n, np.array([r.action]), np.array([r.reward], np.float32), np.array([float(r.done)]), [{}]

    def add(self, item: Any) -> None:
        self.rb.add(*item)

    def sample(self, k: int) -> Any:
        return self.rb.sample(k)

    def own_bytes(self) -> float | None:
        rb = self.rb
        arrays = [rb.observations, rb.actions, rb.rewards, rb.dones, rb.timeouts]
        return float(sum(a.nbytes for a in arrays if a is not None))


class CPPRB(Peer):
    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        super().__init__(capacity, pool, tmp)
        try:
            import cpprb
        except ImportError:
            raise Unsupported("cpprb not installed") from None
        env = {"obs": {"shape": (*FRAME, STACK), "dtype": np.uint8}, "act": {"dtype": np.int64},
               "rew": {}, "done": {}}  # fmt: skip
        self.rb = cpprb.ReplayBuffer(capacity, env, next_of="obs", stack_compress="obs")

    def stack(self, frames: list[int]) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(self.pool[np.asarray(frames) % POOL], 0, -1))  # [84, 84, 4]

    def make_item(self, r: Row) -> Any:
        return {"obs": self.stack(r.state_frames), "next_obs": self.stack(r.next_frames), "act": r.action,
                "rew": r.reward, "done": float(r.done), "_end": r.done}  # fmt: skip

    def add(self, item: Any) -> None:
        end = item.pop("_end")
        self.rb.add(**item)
        item["_end"] = end
        if end:
            self.rb.on_episode_end()

    def sample(self, k: int) -> Any:
        import torch

        return {name: torch.from_numpy(v) for name, v in self.rb.sample(k).items()}


class TorchRL(Peer):
    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        super().__init__(capacity, pool, tmp)
        import torch
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.envs import CatFrames

        cat = CatFrames(N=STACK, dim=-3, in_keys=["pixels"], out_keys=["stacked"], reset_key="_reset")
        transform, sampler = cat.make_rb_transform_and_sampler(batch_size=32, traj_key="episode")
        self.rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, transform=transform,
                               batch_size=32)  # fmt: skip
        self.torch = torch
        self.frames = torch.from_numpy(pool).unsqueeze(1)  # [POOL, 1, 84, 84]

    def make_item(self, r: Row) -> Any:
        from tensordict import TensorDict

        t = self.torch
        s, n = r.state_frames[-1] % POOL, r.next_frames[-1] % POOL
        return TensorDict({
            "pixels": self.frames[s].clone(), "action": t.tensor(r.action), "episode": t.tensor(r.episode),
            "next": {"pixels": self.frames[n].clone(), "reward": t.tensor([r.reward]), "done": t.tensor([r.done]),
                     "terminated": t.tensor([r.done])},
        }, batch_size=[])  # fmt: skip

    def add(self, item: Any) -> None:
        self.rb.add(item)

    def sample(self, k: int) -> Any:
        return self.rb.sample(k)  # k slices of 4 rows (the sampler multiplies), one stacked row each

    def own_bytes(self) -> float | None:
        return float(self.rb.storage._storage.bytes())


class Floor(Peer):
    """Unique frames in one preallocated array, rows as (newest-frame index, episode-first index)."""

    min_episode = 100  # the shortest episode of the stream: each episode adds one frame (its first)

    def __init__(self, capacity: int, pool: np.ndarray, tmp: str) -> None:
        super().__init__(capacity, pool, tmp)
        self.nframes = capacity + capacity // self.min_episode + 2 * STACK  # room for the episodes' first frames
        self.frames = np.zeros((self.nframes, *FRAME), np.uint8)
        self.newest = np.zeros(capacity, np.int64)  # absolute frame number of the row's newest state frame
        self.first = np.zeros(capacity, np.int64)  # absolute frame number of its episode's first frame
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.rng = np.random.default_rng(0)
        self.ptr = self.size = 0
        self.offsets = np.arange(-STACK + 1, 1)

    def make_item(self, r: Row) -> Any:
        start = self.pool[r.first % POOL] if r.frame == r.first else None  # the reset frame, once per episode
        return r.frame, r.first, self.stack(r.next_frames)[-1], start, r.action, r.reward, float(r.done)

    def add(self, item: Any) -> None:
        frame, first, newest, start, action, reward, done = item
        n = self.nframes
        if start is not None:
            self.frames[frame % n] = start
        self.frames[(frame + 1) % n] = newest
        p = self.ptr
        self.newest[p], self.first[p], self.action[p], self.reward[p], self.done[p] = frame, first, action, reward, done
        self.ptr = (p + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, k: int) -> Any:
        import torch

        i = self.rng.integers(0, self.size, k)
        newest, first = self.newest[i, None], self.first[i, None]
        state = np.maximum(newest + self.offsets, first) % self.nframes  # [k, 4]
        nxt = np.maximum(newest + 1 + self.offsets, first) % self.nframes
        frames = self.frames.take(np.concatenate([state.ravel(), nxt.ravel()]), axis=0).reshape(2, k, STACK, *FRAME)
        out = {"state": frames[0], "next_state": frames[1], "action": self.action.take(i),
               "reward": self.reward.take(i), "terminated": self.done.take(i)}  # fmt: skip
        return {key: torch.from_numpy(v) for key, v in out.items()}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"frames": self.frames, "newest": self.newest, "first": self.first, "action": self.action,
                "reward": self.reward, "done": self.done}  # fmt: skip

    def own_bytes(self) -> float | None:
        return float(sum(a.nbytes for a in self.arrays().values()))

    def save(self, path: str) -> None:
        os.makedirs(path)
        for name, a in self.arrays().items():
            with open(os.path.join(path, name), "wb") as f:
                f.write(a.reshape(-1).view(np.uint8).data)
                f.flush()
                os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def load(self, path: str) -> None:
        for name, a in self.arrays().items():
            fresh = np.empty_like(a)
            with open(os.path.join(path, name), "rb") as f:
                f.readinto(fresh.reshape(-1).view(np.uint8).data)
            setattr(self, name, fresh)


CLASSES: dict[str, type[Peer]] = {"compact": Compact, "plain": Ours, "sb3": SB3, "cpprb": CPPRB,
                                  "torchrl": TorchRL, "floor": Floor}  # fmt: skip


# ---------------------------------------------------------------------------- child side
def rss_mb() -> float:
    """Resident memory of this process (anonymous + file-backed + shared), MB."""
    total = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                total += int(value.split()[0]) / 1024
    return total


def summary(means: list[float]) -> dict[str, float]:
    q = statistics.quantiles(means, n=4) if len(means) > 1 else means * 3
    return {"median": statistics.median(means), "q1": q[0], "q3": q[2], "blocks": len(means)}


def time_calls(call: Callable[[], Any], n: int, block: int, warmup: int, budget_s: float = 30.0) -> dict[str, float]:
    """µs per ``call()``: ``warmup`` untimed calls, then ``n`` in blocks of ``block``.

    A peer whose call takes more than 1 ms (torchrl's CatFrames sample takes ~0.5 s here) gets fewer,
    smaller blocks, so that no peer runs for more than about ``budget_s`` seconds.
    """
    t = time.perf_counter()
    call()
    once = time.perf_counter() - t
    if once > 1e-3:
        block = max(1, min(block, int(budget_s / 10 / once)))
        n = max(3 * block, min(n, int(budget_s / once)))
        warmup = min(warmup, 2)
    for _ in range(warmup):
        call()
    gc.collect()
    means = []
    for _ in range(max(n // block, 1)):
        t0 = time.perf_counter_ns()
        for _ in range(block):
            call()
        means.append((time.perf_counter_ns() - t0) / block / 1e3)
    return summary(means)


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    pool = np.random.default_rng(1).integers(0, 256, (POOL, *FRAME), dtype=np.uint8)
    lens = (args.episode_len[0], args.episode_len[1])
    tmp = tempfile.mkdtemp(prefix="pixel-bench-", dir=args.tmp_dir)
    cls = CLASSES[args.child]
    Floor.min_episode = lens[0]
    try:
        warm = cls(64, pool, tmp)  # imports and lazy set-up are not counted in the RSS
        for r in stream(80, 99, (10, 30)):
            warm.add(warm.make_item(r))
        warm.sample(8)
        del warm
        gc.collect()
        total = args.rows + args.adds
        newest, first = np.zeros(total, np.int64), np.zeros(total, np.int64)  # before the RSS baseline
        add_times: list[float] = []
        before = rss_mb()
        peer = cls(args.rows, pool, tmp)
        timed_from = args.rows  # the ring is full from here on: steady state
        pc, block, acc, count = time.perf_counter_ns, args.block, 0, 0
        for i, r in enumerate(stream(total, args.seed, lens)):
            item = peer.make_item(r)
            t = pc()
            peer.add(item)
            dt = pc() - t
            if i >= timed_from:
                acc, count = acc + dt, count + 1
                if count == block:
                    add_times.append(acc / block / 1e3)
                    acc = count = 0
            newest[i], first[i] = r.frame, r.first
        gc.collect()
        res: dict[str, Any] = {"rss_mb": rss_mb() - before, "rows": args.rows}
        res["unique_frames"] = unique_frames(newest[-args.rows :], first[-args.rows :])
        own = peer.own_bytes()
        res["own_bytes"] = own
        res["add"] = summary(add_times)
        res["sample"] = time_calls(lambda: peer.sample(32), args.samples, args.block, 20)
        if args.child in ("compact", "plain", "floor") and not args.no_save:
            path = os.path.join(tmp, "ckpt", "buffer")
            os.makedirs(os.path.dirname(path))
            os.sync()
            start = time.perf_counter()
            peer.save(path)
            res["save_ms"] = (time.perf_counter() - start) * 1e3
            files = [os.path.join(os.path.dirname(path), f) for f in os.listdir(os.path.dirname(path))]
            res["ckpt_bytes"] = sum(dir_bytes(f) for f in files)
            start = time.perf_counter()
            peer.load(path)
            res["load_ms"] = (time.perf_counter() - start) * 1e3
            peer.sample(32)  # the loaded buffer serves
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------- parent side
def run_child(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", peer, "--result", out, "--rows", str(args.rows),
           "--adds", str(args.adds), "--samples", str(args.samples), "--block", str(args.block),
           "--seed", str(args.seed), "--episode-len", *map(str, args.episode_len)]  # fmt: skip
    cmd += ["--tmp-dir", args.tmp_dir] if args.tmp_dir else []
    cmd += ["--no-save"] if args.no_save else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])  # this checkout's package
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
        return dict(json.loads(Path(out).read_text()))
    finally:
        os.unlink(out)


def fmt(x: float, unit: str = "") -> str:
    return f"{x:,.0f}{unit}" if abs(x) >= 100 else f"{x:.2f}{unit}" if abs(x) < 10 else f"{x:.1f}{unit}"


def ratio(x: float | None, base: float | None) -> str:
    return "" if x is None or not base else f" ({x / base:.2f}x)"


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    peers = [p for p in results if "error" not in results[p] and "skipped" not in results[p]]
    rows = args.rows
    frame_row = float(FRAME_BYTES)  # the unique-frame bytes per row: one new 84x84 frame a step
    floor = results.get("floor", {})
    plain = results.get("plain", {})

    def get(p: str, key: str) -> float | None:
        v = results[p].get(key)
        return v["median"] if isinstance(v, dict) else v

    head = "| metric | " + " | ".join(TITLES[p] for p in peers) + " |\n|---|" + "---:|" * len(peers) + "\n"
    lines = []

    def line(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    line("bytes per row, own count (x one frame = 7,056 B)",
         [("n/a" if get(p, "own_bytes") is None else fmt(get(p, "own_bytes") / rows, " B")
           + ratio(get(p, "own_bytes"), frame_row * rows)) for p in peers])  # fmt: skip
    line(f"resident memory added, MB (x unique frames = {frame_row * rows / 2**20:,.0f} MB)",
         [fmt(get(p, "rss_mb") or 0.0) + ratio(get(p, "rss_mb"), frame_row * rows / 2**20) for p in peers])  # fmt: skip
    sb3 = results.get("sb3", {}).get("rss_mb")
    if sb3:
        line("resident memory, x SB3's", [f"{(get(p, 'rss_mb') or 0) / sb3:.2f}x" for p in peers])
    for key, label in (("add", "add, steady state, µs"), ("sample", "sample(32), µs")):
        cells = []
        for p in peers:
            v = get(p, key)
            cells.append("" if v is None else fmt(v) + ratio(v, floor.get(key, {}).get("median"))
                         + (f" / {v / plain[key]['median']:.2f}x plain" if key in plain else ""))  # fmt: skip
        line(f"{label} (x floor / x our plain)", cells)
    for key, label in (("save_ms", "save with data, ms"), ("load_ms", "load, ms"), ("ckpt_bytes", "checkpoint, MB")):
        if not any(key in results[p] for p in peers):
            continue
        div = 2**20 if key == "ckpt_bytes" else 1
        cells = [fmt(results[p][key] / div) + ratio(results[p][key], floor.get(key)) if key in results[p] else "-"
                 for p in peers]  # fmt: skip
        line(f"{label} (x floor)", cells)
    notes = [f"- {TITLES[p]}: {results[p].get('error') or results[p].get('skipped')}"
             for p in results if p not in peers]  # fmt: skip
    uf = next((results[p]["unique_frames"] for p in peers), 0)
    intro = (
        f"{rows:,} rows (capacity {rows:,}, full, then {args.adds:,} timed adds past the wrap), episodes of "
        f"{args.episode_len[0]}-{args.episode_len[1]} steps; the stored rows show {uf:,} unique frames "
        f"({uf / rows:.3f} a row). Median of blocks of {args.block} calls (q1-q3 in the JSON).\n\n"
    )
    return intro + head + "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def machine() -> str:
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    load = os.getloadavg()[0]
    return (f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
            f"load {load:.1f}, Python {platform.python_version()}, commit {commit.stdout.strip()}")  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="capacity and rows stored")
    p.add_argument("--adds", type=int, default=5000, help="timed adds after the ring is full")
    p.add_argument("--samples", type=int, default=2000, help="timed sample(32) calls")
    p.add_argument("--block", type=int, default=100, help="calls per timed block")
    p.add_argument("--episode-len", type=int, nargs=2, default=(200, 2000), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-p", "--peers", default=",".join(PEERS), help=f"comma-separated, of {PEERS}")
    p.add_argument("--quick", action="store_true", help="smoke run: 2000 rows, episodes of 50-300 steps")
    p.add_argument("--no-save", action="store_true", help="skip the checkpoint rows")
    p.add_argument("--tmp-dir", default=None, help="folder for the checkpoints (default: the system temp folder)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("-o", "--output", default=None, help="also write the markdown table here")
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.adds, args.samples, args.block, args.episode_len = 2000, 500, 200, 50, (50, 300)
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    if args.child:
        try:
            res = child(args)
        except Unsupported as exc:
            res = {"skipped": str(exc)}
        Path(args.result).write_text(json.dumps(res))
        return ""
    results: dict[str, dict[str, Any]] = {}
    for peer in args.peers.split(","):
        print(f"running {peer} ...", file=sys.stderr, flush=True)
        results[peer] = run_child(peer, args)
    text = f"{machine()}\n\n" + report(results, args)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return text


if __name__ == "__main__":
    main()
