"""Would lossless compression of stored frames pay here? (issue 25: "measure it before you keep it")

The compact pixel storage keeps one ``uint8[84, 84]`` frame per env step, raw. Reverb compresses chunks of
frames; this script measures what that would buy and cost on this machine, on real frames:

* frames: Atari (``ale-py``'s Pong and Breakout, grayscale, resized to 84x84 as ``AtariPreprocessing`` does,
  random actions, 4-frame skip) when ``ale-py`` is installed, else CartPole rendered with pygame (as
  ``examples/pixel_dqn.py`` sees it); plus uniform random frames, the worst case (what ``pixel_bench.py``
  stores: there nothing compresses);
* codecs: zstd (``zstandard``, levels 1 and 3) and LZ4 (``lz4.block``), each on single frames (what a
  random-access sample needs) and on chunks of 16 consecutive frames (better ratios; a sampled frame then
  costs the whole chunk's decode);
* per codec: the ratio (raw bytes / compressed bytes), compress time per frame (the extra cost of one
  ``add``, which stores one new frame), decompress time per frame, and what a ``sample(32)`` of 4-stacks
  would add: 32 rows x 5 distinct frames (the stack and the next frame) decoded, 160 decodes (of a chunk
  each in the chunked mode).

It prints a Markdown table (medians of ``--rounds`` timed passes). The costs are compared in the text of
docs/pixels.md with the compact buffer's ``add`` and ``sample(32)`` from ``benchmarks/pixels_quick.py``.

    python benchmarks/frame_codec_bench.py                      # 2,000 frames per source
    python benchmarks/frame_codec_bench.py --frames 500 --json out.json

Needs ``zstandard`` and/or ``lz4`` (not dependencies of the library: ``pip install zstandard lz4``); a
missing codec or frame source is named and skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

FRAME = 84
CHUNK = 16  # frames per chunk in the chunked mode
SAMPLE_DECODES = 32 * 5  # a sample(32) of 4-stacks: each row's 4 frames and its next frame


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=2000, help="frames per source (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="timed passes; the median is shown (default 5)")
    p.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    p.add_argument("--seed", type=int, default=0, help="seed of the random actions and frames")
    return p.parse_args(argv)


def _resize(frame: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((FRAME, FRAME), Image.Resampling.BILINEAR))


def atari_frames(game: str, n: int, seed: int) -> np.ndarray | None:
    """``uint8[n, 84, 84]`` frames of ``game`` with random actions, or ``None`` without ``ale-py``."""
    if importlib.util.find_spec("ale_py") is None:
        return None
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", obs_type="grayscale", frameskip=4, repeat_action_probability=0.0)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out: list[np.ndarray] = []
    while len(out) < n:
        out.append(_resize(obs))
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))  # type: ignore[attr-defined]
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(out)


def cartpole_frames(n: int, seed: int) -> np.ndarray | None:
    """CartPole rendered (pygame) to 84x84 grayscale, random actions, or ``None`` without pygame."""
    if importlib.util.find_spec("pygame") is None:
        return None
    import gymnasium as gym
    from PIL import Image

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off screen; no display needed
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    out: list[np.ndarray] = []
    while len(out) < n:
        rgb = env.render()
        assert isinstance(rgb, np.ndarray)
        out.append(np.asarray(Image.fromarray(rgb).convert("L").resize((FRAME, FRAME), Image.Resampling.BILINEAR)))
        _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        if terminated or truncated:
            env.reset()
    env.close()
    return np.stack(out)


Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]


def codecs() -> dict[str, Codec]:
    found: dict[str, Codec] = {}
    if importlib.util.find_spec("zstandard") is not None:
        import zstandard

        for level in (1, 3):
            c, d = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
            found[f"zstd-{level}"] = (c.compress, d.decompress)
    if importlib.util.find_spec("lz4") is not None:
        import lz4.block

        found["lz4"] = (lz4.block.compress, lz4.block.decompress)
    return found


def _median_us(fn: Callable[[], Any], count: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / count * 1e6)
    return statistics.median(times)


def measure(frames: np.ndarray, codec: Codec, chunk: int, rounds: int) -> dict[str, float]:
    """Ratio, compress and decompress microseconds per frame, and the decode cost of one sample(32)."""
    compress, decompress = codec
    pieces = [frames[i : i + chunk].tobytes() for i in range(0, len(frames) - chunk + 1, chunk)]
    blobs = [compress(p) for p in pieces]
    assert all(decompress(b) == p for b, p in zip(blobs, pieces, strict=True))  # lossless, checked
    n = len(pieces) * chunk
    ratio = sum(map(len, pieces)) / sum(map(len, blobs))
    enc = _median_us(lambda: [compress(p) for p in pieces], n, rounds)
    dec_piece = _median_us(lambda: [decompress(b) for b in blobs], len(blobs), rounds)
    return {
        "ratio": ratio,
        "compress_us_per_frame": enc,
        "decompress_us_per_frame": dec_piece / chunk,
        "sample32_decode_us": SAMPLE_DECODES * dec_piece,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    sources: dict[str, np.ndarray | None] = {
        "Pong": atari_frames("Pong", args.frames, args.seed),
        "Breakout": atari_frames("Breakout", args.frames, args.seed),
        "CartPole (rendered)": cartpole_frames(args.frames, args.seed),
        "random": np.random.default_rng(args.seed).integers(0, 256, (args.frames, FRAME, FRAME), dtype=np.uint8),
    }
    found = codecs()
    for name, frames in sources.items():
        if frames is None:
            print(f"skipped frames {name}: its package is not installed")
    if not found:
        print("no codec installed: pip install zstandard lz4")
    rows: list[dict[str, Any]] = []
    for source, frames in sources.items():
        if frames is None:
            continue
        for codec_name, codec in found.items():
            for chunk in (1, CHUNK):
                row = {"frames": source, "codec": codec_name, "chunk": chunk}
                row.update(measure(frames, codec, chunk, args.rounds))
                rows.append(row)
    print(f"{args.frames} frames of 84x84 per source, medians of {args.rounds} passes\n")
    print("| frames | codec | frames a chunk | ratio | compress, us/frame | decompress, us/frame ", end="")
    print("| sample(32) decode, us |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['frames']} | {r['codec']} | {r['chunk']} | {r['ratio']:.1f} | {r['compress_us_per_frame']:.1f} "
            f"| {r['decompress_us_per_frame']:.1f} | {r['sample32_decode_us']:.0f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
