"""Quick side-by-side of the compact pixel storage and the plain one (issue 25 part 1): per-step add and
sample(32) of Atari rows (``uint8[4,84,84]`` state and next_state), and the bytes each buffer takes.

    PYTHONPATH=$PWD python benchmarks/pixels_quick.py --capacity 20000 [--shared]

Not a test: prints a small Markdown table (medians of the timed rounds, ratios compact / plain).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from objectrl_buffer import ReplayBuffer


def atari_rows(n: int, episode: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` consecutive transitions of stacked 84x84 frames, an episode end every ``episode`` steps (and at
    the last row, so the list can be replayed in a cycle)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    stack = None
    for t in range(n):
        if stack is None:
            first = torch.randint(0, 256, (84, 84), generator=g, dtype=torch.uint8)
            stack = torch.stack([first] * 4)
        frame = torch.randint(0, 256, (1, 84, 84), generator=g, dtype=torch.uint8)
        nxt = torch.cat([stack[1:], frame])
        end = (t + 1) % episode == 0 or t == n - 1
        rows.append(
            {
                "state": stack,
                "next_state": nxt,
                "action": torch.tensor([t % 4]),
                "reward": torch.tensor([1.0]),
                "terminated": torch.tensor([end]),
                "truncated": torch.tensor([False]),
            }
        )
        stack = None if end else nxt
    return rows


def run(
    capacity: int, rounds: int, compact: bool, rows: list[dict[str, torch.Tensor]], shared: bool = False
) -> dict[str, float]:
    """Fill a buffer once, then time ``rounds`` blocks of 1,000 adds (overwriting, as in a long run) and 200
    ``sample_batch(32)``; medians per call, and ``nbytes``.

    ``shared``: the buffer in shared-memory mode (``become_shared``: what handing it to a child does), written
    and sampled by this process; ``nbytes`` is then the pages the shared files take. Torch runs single-threaded
    there (as in ``pixel_bench.py``): small ops on a loaded 2-core VM otherwise wait on threads."""
    kwargs = {"next_of": {"next_state": "state"}, "frame_stack": {"state": 4}} if compact else {}
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0, **kwargs)
    n = len(rows)
    first = 0
    if shared:
        from objectrl_buffer.distributed import become_shared

        torch.set_num_threads(1)
        rb.add(rows[0])
        become_shared(rb)
        first = 1
    for t in range(first, capacity):  # fill once: the timed adds then overwrite, as in a long run
        rb.add(rows[t % n])
    adds, samples = [], []
    t = capacity
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(1000):
            rb.add(rows[t % n])
            t += 1
        adds.append((time.perf_counter() - start) / 1000)
        start = time.perf_counter()
        for _ in range(200):
            rb.sample_batch(32)
        samples.append((time.perf_counter() - start) / 200)
    out = {"add": statistics.median(adds), "sample32": statistics.median(samples), "nbytes": rb.nbytes}
    rb.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episode", type=int, default=1000, help="steps per episode of the synthetic stream")
    parser.add_argument("--shared", action="store_true", help="also both buffers in shared-memory mode")
    args = parser.parse_args()
    rows = atari_rows(4 * args.episode, args.episode)
    plain = run(args.capacity, args.rounds, False, rows)
    compact = run(args.capacity, args.rounds, True, rows)
    unique = args.capacity * 84 * 84
    print(f"capacity {args.capacity}, episodes of {args.episode} steps, medians of {args.rounds} rounds\n")
    print("| measure | plain | compact | compact / plain |")
    print("|---|---|---|---|")
    for key, unit, scale in (("add", "us", 1e6), ("sample32", "us", 1e6)):
        p, c = plain[key] * scale, compact[key] * scale
        print(f"| {key} ({unit}) | {p:.1f} | {c:.1f} | {c / p:.2f}x |")
    p, c = plain["nbytes"], compact["nbytes"]
    print(f"| nbytes (MB) | {p / 1e6:.1f} | {c / 1e6:.1f} | {c / p:.3f}x |")
    print(f"| nbytes / unique-frame bytes | {p / unique:.2f} | {c / unique:.3f} | |")
    if args.shared:  # the same, shared (one writer process: the per-step cost of the shared paths)
        plain = run(args.capacity, args.rounds, False, rows, shared=True)
        compact = run(args.capacity, args.rounds, True, rows, shared=True)
        print("\n| shared memory | plain | compact | compact / plain |")
        print("|---|---|---|---|")
        for key, unit, scale in (("add", "us", 1e6), ("sample32", "us", 1e6)):
            p, c = plain[key] * scale, compact[key] * scale
            print(f"| {key} ({unit}) | {p:.1f} | {c:.1f} | {c / p:.2f}x |")
        p, c = plain["nbytes"], compact["nbytes"]
        print(f"| shared files (MB) | {p / 1e6:.1f} | {c / 1e6:.1f} | {c / p:.3f}x |")
        print(f"| shared files / unique-frame bytes | {p / unique:.2f} | {c / unique:.3f} | |")


if __name__ == "__main__":
    main()
