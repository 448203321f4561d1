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
again, as AReaL's producers do. It runs through :class:`AsyncSequenceBuffer`, through a lean model of AReaL's
``AsyncIOSequenceBuffer`` (``areal_upstream.py``: its algorithm with a plain packed sample) and, given
``--areal-source DIR`` (a folder holding AReaL's ``realhf/system/buffer.py`` and ``realhf/api/core/data_api.py``;
no wheel ships them; needs pydantic), through AReaL's own code. Each measurement is a fresh process (a warm-up
run, then the timed one); it reports the process CPU time and the ratios, at ``max_size`` 100,000 (writers
never blocked) and 1,024 (writers meet ``BufferFull`` often), plus how many puts were refused.

A second table times each operation alone (a put of 64, an amend of 64, one get per consumer) per call.
Sequences are generated once up front, so generation is not timed. The table gives the median over
``--rounds`` rounds and the spread (min-max).

Usage (from the repository root)::

    python benchmarks/async_bench.py                    # 3 x 20 batches of 64, 5 rounds
    python benchmarks/async_bench.py --batches 5 --rounds 2   # a quick run
    python benchmarks/async_bench.py --areal-only --rounds 5  # only the AReaL pipeline against upstream's model
    python benchmarks/async_bench.py --areal-only --areal-source ~/AReaL   # ... and against AReaL's own code
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from areal_upstream import Sample, UpstreamModel, load_real

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, Consumer

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


#: The implementations the AReaL table compares: ours, the model of upstream, upstream's own code.
IMPLS = ("ours", "model", "areal")


def areal_inputs(
    tokens: list[list[torch.Tensor]], impl: str, source: str = ""
) -> tuple[Any, list[list[Any]], list[list[Any]]]:
    """``(buffer class, [writer][i] samples, the rewards the amender adds)``, built untimed like the tokens."""
    per = len(tokens[0])
    if impl == "ours":
        cls: Any = AsyncSequenceBuffer

        def sample(i: int, t: torch.Tensor) -> Any:
            return {"ids": i, "tokens": t}

        def reward(i: int, r: torch.Tensor) -> Any:
            return {"ids": i, "rewards": r[0]}

    else:
        if impl == "model":
            cls, sample_cls = UpstreamModel, Sample

            def make(i: int, key: str, t: torch.Tensor) -> Any:
                return Sample([i], {key: [[t.shape[0]]]}, {key: t})

        else:
            cls, sample_cls, _ = load_real(source)

            def make(i: int, key: str, t: torch.Tensor) -> Any:
                return sample_cls(
                    keys={key},
                    ids=[i],
                    seqlens={key: [[t.shape[0]]]},
                    trailing_shapes={key: ()},
                    dtypes={key: t.dtype},
                    data={key: t},
                )

        def sample(i: int, t: torch.Tensor) -> Any:
            return make(i, "tokens", t)

        def reward(i: int, r: torch.Tensor) -> Any:
            return make(i, "rewards", r)

    writers = [[sample(w * per + i, t) for i, t in enumerate(mine)] for w, mine in enumerate(tokens)]
    rewards = [[reward(w * per + i, torch.ones(1)) for i in range(per)] for w in range(len(tokens))]
    return cls, writers, rewards


async def areal_pipeline(inputs: tuple[Any, list[list[Any]], list[list[Any]]], max_size: int) -> int:
    """Run AReaL's pipeline shape once; return how many puts met ``BufferFull``.

    ``inputs`` (from :func:`areal_inputs`) are built before the timing starts, as the tokens are."""
    cls, writers, rewards = inputs
    buf = cls(AREAL_CONSUMERS, max_size)
    to_amend: asyncio.Queue[tuple[Any, list[Any]]] = asyncio.Queue()
    refused = 0
    per = len(writers[0])

    async def writer(w: int) -> None:
        nonlocal refused
        for start in range(0, per, AREAL_PUT):
            batch = writers[w][start : start + AREAL_PUT]
            while True:
                try:
                    slots = await buf.put_batch(batch)
                    break
                except Exception as exc:  # each implementation's own BufferFull
                    if type(exc).__name__ != "BufferFull":
                        raise
                    refused += 1
                    await asyncio.sleep(0)  # let the readers free slots, then try again
            await to_amend.put((slots, rewards[w][start : start + AREAL_PUT]))

    async def amender() -> None:
        for _ in range(AREAL_TOTAL // AREAL_PUT):
            slots, amends = await to_amend.get()
            await buf.amend_batch(slots, amends)

    async def consumer(c: Consumer) -> None:
        for _ in range(AREAL_TOTAL // AREAL_READ):
            await buf.get_batch_for_rpc(c)

    await asyncio.gather(*(writer(w) for w in range(AREAL_WRITERS)), amender(), *map(consumer, AREAL_CONSUMERS))
    assert buf.size == 0
    return refused


def areal_child(impl: str, max_size: int, source: str) -> None:
    """One measurement in a fresh process: a warm-up run, then the timed one; prints JSON."""
    tokens = areal_tokens()
    asyncio.run(areal_pipeline(areal_inputs(tokens, impl, source), max_size))
    inputs = areal_inputs(tokens, impl, source)
    gc.collect()
    start = time.process_time()
    refused = asyncio.run(areal_pipeline(inputs, max_size))
    print(json.dumps({"cpu": time.process_time() - start, "refused": refused}))


def areal_table(sizes: list[int], n_rounds: int, source: str) -> None:
    impls = [i for i in IMPLS if i != "areal" or source]
    print(
        f"\nAReaL's pipeline shape: {AREAL_WRITERS} writers x {AREAL_TOTAL // AREAL_WRITERS} sequences "
        f"(puts of {AREAL_PUT}, retried on BufferFull), 1 reward amender, 2 consumers reading {AREAL_READ}; "
        f"process CPU time of the timed run (after a warm-up run) in a fresh process per measurement, median of "
        f"{n_rounds} rounds (rounds interleaved)\n"
    )
    names = {"ours": "ours", "model": "model of AReaL", "areal": "AReaL's code"}
    print(
        "| max_size | "
        + " | ".join(f"{names[i]} (s)" for i in impls)
        + " | "
        + " | ".join(f"ours / {names[i]}" for i in impls[1:])
        + " | refused puts ("
        + ", ".join(impls)
        + ") |"
    )
    print("|---|" + "---|" * (2 * len(impls)))
    for size in sizes:
        got: dict[str, list[dict[str, float]]] = {i: [] for i in impls}
        for _ in range(n_rounds):
            for impl in impls:
                cmd = [sys.executable, __file__, "--areal-child", impl, "--areal-sizes", str(size)]
                out = subprocess.run(
                    cmd + (["--areal-source", source] if source else []), capture_output=True, text=True, check=True
                )
                got[impl].append(json.loads(out.stdout.strip().splitlines()[-1]))
        cpu = {i: [r["cpu"] for r in got[i]] for i in impls}
        ratios = {i: [o / t for o, t in zip(cpu["ours"], cpu[i], strict=True)] for i in impls[1:]}
        print(
            f"| {size:,} | "
            + " | ".join(f"{statistics.median(cpu[i]):.3f}" for i in impls)
            + " | "
            + " | ".join(
                f"{statistics.median(ratios[i]):.2f}x ({min(ratios[i]):.2f}-{max(ratios[i]):.2f})" for i in impls[1:]
            )
            + " | "
            + ", ".join(f"{statistics.median([r['refused'] for r in got[i]]):.0f}" for i in impls)
            + " |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="batches of 64 per producer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1000,100000", help="max_size values of the buffer")
    parser.add_argument("--areal-sizes", default="100000,1024", help="max_size values of the AReaL pipeline")
    parser.add_argument("--areal-only", action="store_true", help="only the AReaL pipeline table")
    parser.add_argument(
        "--areal-source",
        default="",
        help="a folder holding AReaL's realhf/system/buffer.py and realhf/api/core/data_api.py: adds upstream's "
        "own code to the AReaL table (needs pydantic)",
    )
    parser.add_argument("--areal-child", choices=IMPLS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    areal_sizes = [int(s) for s in args.areal_sizes.split(",")]
    if args.areal_child:
        areal_child(args.areal_child, areal_sizes[0], args.areal_source)
        return
    if args.areal_only:
        areal_table(areal_sizes, args.rounds, args.areal_source)
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
    areal_table(areal_sizes, args.rounds, args.areal_source)


if __name__ == "__main__":
    main()
