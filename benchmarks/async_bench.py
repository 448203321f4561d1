"""AsyncSequenceBuffer throughput: put -> amend -> get through the buffer against a plain asyncio.Queue floor.

The pipeline (issue 15): 3 producer tasks put batches of 64 sequences (int64 token ids, lengths drawn in
[64, 2048]), 1 amender task adds a scalar ``rewards`` to each, and 2 consumers read batches of 64:
``actor_train`` (needs tokens and rewards) and ``ref_logp`` (tokens only). Each consumer builds its batch as
a jagged nested tensor of the tokens, in both rows, so the floor does the same copies and only the buffer's
bookkeeping differs.

* buffer: :class:`AsyncSequenceBuffer` of ``max_size`` 1k and 100k (per-operation state updates are vector
  ops over ``max_size`` rows; the second size shows whether they grow with it)
* queue floor: ``asyncio.Queue`` per hop (producer -> amender -> actor_train, producer -> ref_logp), no ids,
  no birth order, no freeing: the least an asyncio pipeline can do

A third table runs AReaL's pipeline shape (issue 26): 4 rollout writers put 16 sequences at a time (10,240 in
all, lengths 16-512), a reward amender amends each put, 2 consumers read 64 at a time (``actor_train`` needs
tokens and rewards, ``ref_inf`` tokens only); a writer that meets ``BufferFull`` yields to the loop and tries
again, as AReaL's producers do. It runs through :class:`AsyncSequenceBuffer` and through a model of AReaL's
own ``AsyncIOSequenceBuffer`` (``areal_upstream.py``; no wheel ships it) and reports the process CPU time of
each and their ratio, at ``max_size`` 100,000 (writers never blocked) and 1,024 (writers meet ``BufferFull``
often), plus how many puts were refused.

A second table times each operation alone (a put of 64, an amend of 64, one get per consumer) per call.
Sequences are generated once up front, so generation is not timed. The table gives the median over
``--rounds`` rounds and the spread (min-max).

Usage (from the repository root)::

    python benchmarks/async_bench.py                    # 3 x 20 batches of 64, 5 rounds
    python benchmarks/async_bench.py --batches 5 --rounds 2   # a quick run
    python benchmarks/async_bench.py --areal-only --rounds 5  # only the AReaL pipeline against upstream's model
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from areal_upstream import BufferFull as UpstreamFull
from areal_upstream import Sample, UpstreamModel

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, BufferFull, Consumer

BATCH = 64
PRODUCERS = 3
CONSUMERS = [Consumer("actor_train", ("tokens", "rewards"), BATCH), Consumer("ref_logp", ("tokens",), BATCH)]


def make_samples(batches: int, seed: int = 0) -> list[list[list[dict[str, Any]]]]:
    """``[producer][batch][i]`` samples with unique ids and tokens of 64-2048 ids."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p in range(PRODUCERS):
        per = []
        for b in range(batches):
            lengths = torch.randint(64, 2049, (BATCH,), generator=gen).tolist()
            first = (p * batches + b) * BATCH
            per.append([{"ids": first + i, "tokens": torch.randint(0, 32000, (n,))} for i, n in enumerate(lengths)])
        out.append(per)
    return out


def jagged(parts: list[torch.Tensor]) -> torch.Tensor:
    """What a consumer of the queue floor builds: the same packed batch the buffer returns."""
    lengths = torch.tensor([t.shape[0] for t in parts])
    offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return torch.nested.nested_tensor_from_jagged(torch.cat(parts), offsets)


async def through_buffer(samples: list[list[list[dict[str, Any]]]], max_size: int) -> int:
    buf = AsyncSequenceBuffer(CONSUMERS, max_size)
    total = sum(len(b) for per in samples for b in per)
    to_amend: asyncio.Queue[tuple[torch.Tensor, list[int]]] = asyncio.Queue()

    async def producer(batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            slots = await buf.put_batch(batch)
            await to_amend.put((slots, [s["ids"] for s in batch]))
            await asyncio.sleep(0)

    async def amender() -> None:
        for _ in range(total // BATCH):
            slots, ids = await to_amend.get()
            await buf.amend_batch(slots, [{"ids": i, "rewards": torch.tensor(1.0)} for i in ids])

    async def consumer(c: Consumer) -> int:
        read = 0
        while read < total:
            _, batch = await buf.get_batch(c)
            read += batch.batch_size[0]
        return read

    *_, read_a, read_b = await asyncio.gather(*(producer(p) for p in samples), amender(), *map(consumer, CONSUMERS))
    assert buf.size == 0 and read_a == read_b == total
    return total


async def through_queues(samples: list[list[list[dict[str, Any]]]]) -> int:
    total = sum(len(b) for per in samples for b in per)
    to_amend: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    to_train: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    to_ref: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def producer(batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            await to_amend.put(batch)
            for s in batch:
                to_ref.put_nowait(s)
            await asyncio.sleep(0)

    async def amender() -> None:
        for _ in range(total // BATCH):
            for s in await to_amend.get():
                to_train.put_nowait({**s, "rewards": torch.tensor(1.0)})

    async def consumer(queue: asyncio.Queue[dict[str, Any]], rewards: bool) -> int:
        read = 0
        while read < total:
            got = [await queue.get() for _ in range(BATCH)]
            jagged([s["tokens"] for s in got])
            if rewards:
                torch.stack([s["rewards"] for s in got])
            read += len(got)
        return read

    await asyncio.gather(*(producer(p) for p in samples), amender(), consumer(to_train, True), consumer(to_ref, False))
    return total


def rounds(fn: Callable[[], float], n: int) -> tuple[float, float, float]:
    fn()  # warm-up
    values = [fn() for _ in range(n)]
    return statistics.median(values), min(values), max(values)


def pipeline_rate(samples: list[list[list[dict[str, Any]]]], max_size: int | None) -> float:
    start = time.perf_counter()
    coro = through_queues(samples) if max_size is None else through_buffer(samples, max_size)
    total = asyncio.run(coro)
    return total / (time.perf_counter() - start)


def per_op(max_size: int, samples: list[list[dict[str, Any]]], calls: int) -> dict[str, float]:
    """Microseconds per put_batch(64), amend_batch(64), get_batch per consumer, averaged over ``calls``."""
    buf = AsyncSequenceBuffer(CONSUMERS, max_size)
    times = {"put_batch(64)": 0.0, "amend_batch(64)": 0.0, "get_batch(actor_train)": 0.0, "get_batch(ref_logp)": 0.0}

    async def go() -> None:
        for k in range(calls):
            batch = [dict(s, ids=s["ids"] + k * 10**6) for s in samples[k % len(samples)]]
            t0 = time.perf_counter()
            slots = await buf.put_batch(batch)
            t1 = time.perf_counter()
            await buf.amend_batch(slots, [{"ids": s["ids"], "rewards": torch.tensor(1.0)} for s in batch])
            t2 = time.perf_counter()
            await buf.get_batch("actor_train")
            t3 = time.perf_counter()
            await buf.get_batch("ref_logp")
            t4 = time.perf_counter()
            for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[key] += dt

    asyncio.run(go())
    return {k: v / calls * 1e6 for k, v in times.items()}


AREAL_WRITERS, AREAL_PUT, AREAL_READ, AREAL_TOTAL = 4, 16, 64, 10_240
AREAL_CONSUMERS = [
    Consumer("actor_train", ("tokens", "rewards"), AREAL_READ),
    Consumer("ref_inf", ("tokens",), AREAL_READ),
]


def areal_tokens(seed: int = 0) -> list[list[torch.Tensor]]:
    """``[writer][i]`` token tensors (lengths 16-512), generated once, untimed."""
    gen = torch.Generator().manual_seed(seed)
    per = AREAL_TOTAL // AREAL_WRITERS
    return [
        [torch.randint(0, 32000, (int(n),), generator=gen) for n in torch.randint(16, 513, (per,), generator=gen)]
        for _ in range(AREAL_WRITERS)
    ]


def sample(i: int, t: torch.Tensor, upstream: bool) -> Any:
    return Sample([i], {"tokens": [[t.shape[0]]]}, {"tokens": t}) if upstream else {"ids": i, "tokens": t}


def reward(i: int, upstream: bool) -> Any:
    r = torch.ones(1)
    return Sample([i], {"rewards": [[1]]}, {"rewards": r}) if upstream else {"ids": i, "rewards": r[0]}


def areal_inputs(tokens: list[list[torch.Tensor]], upstream: bool) -> tuple[list[list[Any]], list[list[Any]]]:
    """``[writer][i]`` samples and the rewards the amender adds to them, built untimed (like the tokens)."""
    per = len(tokens[0])
    writers = [[sample(w * per + i, t, upstream) for i, t in enumerate(mine)] for w, mine in enumerate(tokens)]
    rewards = [[reward(w * per + i, upstream) for i in range(per)] for w in range(len(tokens))]
    return writers, rewards


async def areal_pipeline(inputs: tuple[list[list[Any]], list[list[Any]]], max_size: int, upstream: bool) -> int:
    """Run AReaL's pipeline shape once; return how many puts met ``BufferFull``.

    ``inputs`` (from :func:`areal_inputs`) are built before the timing starts, as the tokens are."""
    buf: Any = UpstreamModel(AREAL_CONSUMERS, max_size) if upstream else AsyncSequenceBuffer(AREAL_CONSUMERS, max_size)
    full_error = UpstreamFull if upstream else BufferFull
    to_amend: asyncio.Queue[tuple[Any, list[Any]]] = asyncio.Queue()
    refused = 0
    writers, rewards = inputs
    per = len(writers[0])

    async def writer(w: int) -> None:
        nonlocal refused
        for start in range(0, per, AREAL_PUT):
            batch = writers[w][start : start + AREAL_PUT]
            while True:
                try:
                    slots = await buf.put_batch(batch)
                    break
                except full_error:
                    refused += 1
                    await asyncio.sleep(0)  # let the readers free slots, then try again
            await to_amend.put((slots, rewards[w][start : start + AREAL_PUT]))

    async def amender() -> None:
        for _ in range(AREAL_TOTAL // AREAL_PUT):
            slots, amends = await to_amend.get()
            await buf.amend_batch(slots, amends)

    async def consumer(c: Consumer) -> None:
        for _ in range(AREAL_TOTAL // AREAL_READ):
            await (buf.get_batch_for_rpc(c) if upstream else buf.get_batch(c))

    await asyncio.gather(*(writer(w) for w in range(AREAL_WRITERS)), amender(), *map(consumer, AREAL_CONSUMERS))
    assert buf.size == 0
    return refused


def areal_cpu(tokens: list[list[torch.Tensor]], max_size: int, upstream: bool) -> tuple[float, int]:
    inputs = areal_inputs(tokens, upstream)
    start = time.process_time()
    refused = asyncio.run(areal_pipeline(inputs, max_size, upstream))
    return time.process_time() - start, refused


def areal_table(sizes: list[int], n_rounds: int) -> None:
    tokens = areal_tokens()
    print(
        f"\nAReaL's pipeline shape: {AREAL_WRITERS} writers x {AREAL_TOTAL // AREAL_WRITERS} sequences "
        f"(puts of {AREAL_PUT}, retried on BufferFull), 1 reward amender, 2 consumers reading {AREAL_READ}; "
        f"process CPU time, median of {n_rounds} rounds (rounds interleaved)\n"
    )
    print("| max_size | AReaL model (s) | ours (s) | ours / AReaL | refused puts (AReaL, ours) |")
    print("|---|---|---|---|---|")
    for size in sizes:
        areal_cpu(tokens, size, True), areal_cpu(tokens, size, False)  # warm-up
        theirs, ours, ratios, refused = [], [], [], ([], [])
        for _ in range(n_rounds):
            t, r_t = areal_cpu(tokens, size, True)
            o, r_o = areal_cpu(tokens, size, False)
            theirs.append(t)
            ours.append(o)
            ratios.append(o / t)
            refused[0].append(r_t)
            refused[1].append(r_o)
        print(
            f"| {size:,} | {statistics.median(theirs):.3f} | {statistics.median(ours):.3f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(refused[0]):.0f}, {statistics.median(refused[1]):.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="batches of 64 per producer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1000,100000", help="max_size values of the buffer")
    parser.add_argument("--areal-sizes", default="100000,1024", help="max_size values of the AReaL pipeline")
    parser.add_argument("--areal-only", action="store_true", help="only the AReaL pipeline table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    areal_sizes = [int(s) for s in args.areal_sizes.split(",")]
    if args.areal_only:
        areal_table(areal_sizes, args.rounds)
        return
    samples = make_samples(args.batches)
    sizes = [int(s) for s in args.sizes.split(",")]
    floor = rounds(lambda: pipeline_rate(samples, None), args.rounds)
    print(
        f"{PRODUCERS} producers x {args.batches} batches of {BATCH} (lengths 64-2048), 1 amender, 2 consumers; "
        f"median of {args.rounds} rounds\n"
    )
    print("| pipeline | sequences/s (median) | spread | us per sequence | vs queue floor |")
    print("|---|---|---|---|---|")
    print(f"| asyncio.Queue floor | {floor[0]:,.0f} | {floor[1]:,.0f}-{floor[2]:,.0f} | {1e6 / floor[0]:.1f} | 1.00x |")
    for size in sizes:
        got = rounds(lambda size=size: pipeline_rate(samples, size), args.rounds)  # type: ignore[misc]
        print(
            f"| AsyncSequenceBuffer max_size={size:,} | {got[0]:,.0f} | {got[1]:,.0f}-{got[2]:,.0f} | "
            f"{1e6 / got[0]:.1f} | {floor[0] / got[0]:.2f}x |"
        )
    print("\n| operation | " + " | ".join(f"max_size={s:,} (us/call)" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    ops = [per_op(size, samples[0], max(20, args.batches * 2)) for size in sizes]
    for key in ops[0]:
        print(f"| {key} | " + " | ".join(f"{o[key]:.0f}" for o in ops) + " |")
    areal_table(areal_sizes, args.rounds)


if __name__ == "__main__":
    main()
