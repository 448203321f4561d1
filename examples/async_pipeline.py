"""An asynchronous RL data pipeline on one event loop, through :class:`AsyncSequenceBuffer`.

Three rollout tasks generate variable-length sequences (prompt + response token ids) and put them; a reward
task amends each with a scalar ``rewards``; two trainer RPCs read batches once their keys are there:
``actor_train`` needs tokens and rewards, ``ref_logp`` only tokens. Every entry is read once by each and
freed after both. The consumers use the jagged batch the way variable-length attention does: the packed
``values()`` and the ``offsets()`` (cu_seqlens).

    python examples/async_pipeline.py                    # 3 x 20 batches of 16
    python examples/async_pipeline.py --batches 5 --save /tmp/pipeline.ckpt
"""

from __future__ import annotations

import argparse
import asyncio
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Rollout -> reward -> two trainers, through one AsyncSequenceBuffer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--batches", type=int, default=20, help="batches per rollout worker")
    parser.add_argument("--size", type=int, default=16, help="sequences per batch (and per trainer batch)")
    parser.add_argument("--max-size", type=int, default=256, help="sequences the buffer holds before put waits")
    parser.add_argument("--save", default=None, help="save the (drained) buffer here at the end")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and argument errors answer here, before torch loads (seconds)

import torch

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, BufferFull, Consumer


async def rollout(buf: AsyncSequenceBuffer, worker: int, batches: int, size: int, scored: asyncio.Queue) -> None:
    """Generate ``batches`` batches of ``size`` sequences (lengths 8-256) and put them."""
    gen = torch.Generator().manual_seed(worker)
    for b in range(batches):
        first = (worker * batches + b) * size
        lengths = torch.randint(8, 257, (size,), generator=gen).tolist()
        samples = [
            {"ids": first + i, "tokens": torch.randint(0, 32000, (n,), generator=gen)} for i, n in enumerate(lengths)
        ]
        while True:
            try:
                slots = await buf.put_batch(samples)
                break
            except BufferFull:  # the trainers are behind: back off, nothing was stored
                await asyncio.sleep(0.001)
        await scored.put((slots, [s["ids"] for s in samples]))
        await asyncio.sleep(0)  # a real worker awaits its inference engine here


async def reward(buf: AsyncSequenceBuffer, total_batches: int, scored: asyncio.Queue) -> None:
    """Amend every put batch with a reward (a stand-in scorer: 1.0 for odd ids, 0.0 for even)."""
    for _ in range(total_batches):
        slots, ids = await scored.get()
        rewards = [{"ids": i, "rewards": torch.tensor(float(i % 2))} for i in ids]
        await buf.amend_batch(slots, rewards)


async def train(buf: AsyncSequenceBuffer, consumer: Consumer, total: int, seen: list[int]) -> None:
    while len(seen) < total:
        _, batch = await asyncio.wait_for(buf.get_batch(consumer), 30)
        tokens = batch["tokens"]
        if tokens.is_nested:  # lengths differ: packed values + cu_seqlens, as flash-attention varlen takes them
            packed, cu_seqlens = tokens.values(), tokens.offsets()
            assert cu_seqlens[-1] == packed.shape[0]
        if "rewards" in consumer.input_keys:
            assert batch["rewards"].shape == (consumer.n_seqs,)
        seen.extend(batch["ids"].tolist())


async def main(batches: int, size: int, max_size: int) -> tuple[AsyncSequenceBuffer, dict[str, list[int]], float]:
    consumers = [Consumer("actor_train", ("tokens", "rewards"), size), Consumer("ref_logp", ("tokens",), size)]
    buf = AsyncSequenceBuffer(consumers, max_size)
    scored: asyncio.Queue = asyncio.Queue()
    total = 3 * batches * size
    seen: dict[str, list[int]] = {c.name: [] for c in consumers}
    start = time.perf_counter()
    await asyncio.gather(
        *(rollout(buf, w, batches, size, scored) for w in range(3)),
        reward(buf, 3 * batches, scored),
        *(train(buf, c, total, seen[c.name]) for c in consumers),
    )
    return buf, seen, time.perf_counter() - start


if __name__ == "__main__":
    args = parse_args()
    buf, seen, seconds = asyncio.run(main(args.batches, args.size, args.max_size))
    total = 3 * args.batches * args.size
    for name, ids in seen.items():
        assert sorted(ids) == list(range(total)), name  # every sequence exactly once per trainer
    buf.check_invariants()
    print(
        f"{total} sequences through put -> amend -> 2 trainers in {seconds:.3f} s: {total / seconds:,.0f} sequences/s"
    )
    print(f"left in the buffer: {buf.size}; freed: {len(buf.consumed_ids())}")
    if args.save:
        buf.save(args.save)
        print(f"saved to {args.save}")
