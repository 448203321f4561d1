"""AsyncSequenceBuffer: put / amend / get per consumer, freeing, birth order, errors, cancellation, jagged batches.

Every coroutine runs under ``asyncio.wait_for`` (helpers.run / bounded), so a hang fails instead of stalling.
"""

from __future__ import annotations

import asyncio
import random
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer.async_buffer import AsyncIOSequenceBuffer, AsyncSequenceBuffer, BufferFull, Consumer
from objectrl_buffer.errors import InconsistentStateError, ReplayBufferError, SchemaError, SlotIndexError
from tests.async_buffer.helpers import assert_unchanged, bounded, make, reward, run, seq, snapshot, two_consumers


# ---------------------------------------------------------------- construction
def test_consumers_are_checked() -> None:
    with pytest.raises(ValueError, match="unique"):
        AsyncSequenceBuffer([Consumer("a", ("x",), 1), Consumer("a", ("y",), 1)], 4)
    with pytest.raises(ValueError, match="n_seqs"):
        Consumer("a", ("x",), 0)
    with pytest.raises(ValueError, match="consumers"):
        AsyncSequenceBuffer([], 4)
    with pytest.raises(ValueError, match="max_size"):
        AsyncSequenceBuffer(two_consumers(), 0)
    rpc = SimpleNamespace(name="ref", input_keys=["tokens"], n_seqs=3)  # AReaL's MFCDef has these attributes
    buf = AsyncIOSequenceBuffer([rpc], 4)
    assert buf.consumers == (Consumer("ref", ("tokens",), 3),)
    assert (buf.size, buf.max_size, buf.n_consumers) == (0, 4, 1)


# ---------------------------------------------------------------- put
def test_put_takes_lowest_free_slots_and_reuses_freed_ones() -> None:
    buf = make(8, consumers=[Consumer("c", ("tokens",), 2)])

    async def go() -> None:
        assert (await buf.put_batch([seq(i) for i in range(5)])).tolist() == [0, 1, 2, 3, 4]
        slots, _ = await bounded(buf.get_batch("c"))  # the two oldest: slots 0, 1 freed
        assert slots.tolist() == [0, 1]
        assert buf.size == 3
        assert (await buf.put_batch([seq(10), seq(11), seq(12)])).tolist() == [0, 1, 5]
        buf.check_invariants()

    run(go())


def test_buffer_full_changes_nothing() -> None:
    buf = make(4)
    run(buf.put_batch([seq(i) for i in range(3)]))
    before = snapshot(buf)
    with pytest.raises(BufferFull, match=r"2 samples.*holds 3 of max_size 4") as info:
        run(buf.put_batch([seq(10), seq(11)]))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ReplayBufferError)
    assert_unchanged(buf, before)
    assert run(buf.put_batch([seq(10)])).tolist() == [3]  # what fits still goes in


def test_empty_put_returns_empty_tensor() -> None:
    buf = make()
    slots = run(buf.put_batch([]))
    assert slots.dtype == torch.int64 and slots.shape == (0,)
    assert buf.put_batch_nowait(TensorDict({}, batch_size=[0])).shape == (0,)
    assert buf.size == 0


@pytest.mark.parametrize(
    ("samples", "birth_times", "match"),
    [
        ([seq(1), seq(1)], None, r"ids \[1\] appear more than once"),
        ([seq(2), seq(0)], None, r"ids \[0\] are already in the buffer"),
        ([seq(2), seq(3)], [1], "birth_times.*length 2"),
        ([seq(2), seq(3)], [[1, 2]], "birth_times"),
        ([seq(2), seq(3)], [1.0, 2.0], "birth_times"),
        ([{"tokens": torch.ones(2)}], None, "'ids'"),
        ([{"ids": 1.5}], None, "'ids' must be an integer"),
        ([{"ids": 2, "tokens": torch.ones(3)}], None, "tokens.*int64"),  # float where int64 tokens are stored
        ([{"ids": 2, "tokens": torch.ones(3, 2, dtype=torch.int64)}], None, "tokens"),  # another trailing shape
        ({"ids": 2}, None, "list of mappings"),
    ],
)
def test_bad_puts_are_value_errors_and_change_nothing(samples: Any, birth_times: Any, match: str) -> None:
    buf = make()
    run(buf.put_batch([seq(0)]))
    before = snapshot(buf)
    with pytest.raises(ValueError, match=match):
        run(buf.put_batch(samples, birth_times))
    assert_unchanged(buf, before)


def test_schema_error_is_a_value_error() -> None:
    buf = make()
    buf.put_batch_nowait([seq(0)])
    with pytest.raises(SchemaError, match="'tokens' holds int64 \\(L\\)"):
        buf.put_batch_nowait([{"ids": 1, "tokens": torch.zeros(2)}])


# ---------------------------------------------------------------- birth order
def test_reversed_birth_times_come_out_in_birth_order() -> None:
    buf = make(8, consumers=[Consumer("c", ("tokens",), 2)])

    async def go() -> list[list[int]]:
        await buf.put_batch([seq(i) for i in range(6)], birth_times=[60, 50, 40, 30, 20, 10])
        out = []
        for _ in range(3):
            slots, batch = await bounded(buf.get_batch("c"))
            assert batch["ids"].tolist() == slots.tolist()  # id i went to slot i
            out.append(batch["ids"].tolist())
            buf.check_invariants()
        return out

    assert run(go()) == [[5, 4], [3, 2], [1, 0]]


def test_default_birth_times_increase_across_batches() -> None:
    buf = make(16, consumers=[Consumer("c", ("tokens",), 6)])

    async def go() -> list[int]:
        for first in (0, 2, 4):
            await buf.put_batch([seq(first), seq(first + 1)])
        _, batch = await bounded(buf.get_batch("c"))
        return batch["ids"].tolist()

    assert run(go()) == [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------- freeing
def test_entry_is_freed_after_both_consumers_read_it_and_slot_reused() -> None:
    buf = make(4, consumers=two_consumers(2, 2))

    async def go() -> None:
        await buf.put_batch([seq(0), seq(1)])
        await buf.amend_batch([0, 1], [reward(0), reward(1)])
        await bounded(buf.get_batch("ref_logp"))
        assert buf.size == 2 and buf.consumed_ids() == []
        with pytest.raises(asyncio.TimeoutError):  # ref_logp read them already: never twice
            await asyncio.wait_for(buf.get_batch("ref_logp"), 0.05)
        slots, batch = await bounded(buf.get_batch("actor_train"))
        assert slots.tolist() == [0, 1] and batch["rewards"].tolist() == [0.0, 1.0]
        assert buf.size == 0 and buf.consumed_ids() == [0, 1]
        assert (await buf.put_batch([seq(7)])).tolist() == [0]
        buf.check_invariants()

    run(go())


# ---------------------------------------------------------------- amend
def test_get_blocked_on_missing_key_is_woken_by_amend() -> None:
    buf = make()

    async def go() -> None:
        slots = await buf.put_batch([seq(0), seq(1)])
        waiter = asyncio.ensure_future(buf.get_batch("actor_train"))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # tokens alone are not enough for actor_train
        await buf.amend_batch(slots[:1], [reward(0)])
        await asyncio.sleep(0.01)
        assert not waiter.done()  # one ready, it needs two
        await buf.amend_batch(slots[1:], [reward(1)])
        got, batch = await bounded(waiter)
        assert got.tolist() == [0, 1] and batch.keys() >= {"ids", "tokens", "rewards"}
        buf.check_invariants()

    run(go())


def test_amend_errors_are_immediate_and_change_nothing() -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0), seq(1)])
    before = snapshot(buf)
    cases: list[tuple[Any, Any, type[Exception], str]] = [
        ([2], [reward(2)], SlotIndexError, "empty slots"),  # upstream waits forever here
        ([4], [reward(4)], SlotIndexError, "out of range"),
        ([-1], [reward(4)], SlotIndexError, "out of range"),
        ([1], [reward(0)], ValueError, "slot 1 holds ids 1"),
        ([0, 0], [reward(0), reward(0)], ValueError, "more than once"),
        ([0, 1], [reward(0)], ValueError, "2 indices but 1 samples"),
        ([0.5], [reward(0)], ValueError, "integer"),
        ([0], [{"ids": 0, "tokens": torch.zeros(2)}], SchemaError, "tokens"),
    ]
    for indices, samples, exc, match in cases:
        with pytest.raises(exc, match=match):
            run(buf.amend_batch(indices, samples), timeout=1.0)
        assert_unchanged(buf, before)
    assert issubclass(SlotIndexError, IndexError)


def test_amend_after_free_is_an_index_error() -> None:
    buf = make(4, consumers=[Consumer("c", ("tokens",), 1)])

    async def go() -> None:
        slots = await buf.put_batch([seq(0)])
        await bounded(buf.get_batch("c"))
        with pytest.raises(IndexError, match="empty"):
            await bounded(buf.amend_batch(slots, [reward(0)]))

    run(go())


# ---------------------------------------------------------------- get
def test_unknown_consumer_is_a_value_error() -> None:
    buf = make()
    with pytest.raises(ValueError, match="consumer 'critic' is unknown"):
        run(buf.get_batch("critic"))
    with pytest.raises(ValueError, match="unknown"):
        run(buf.get_batch_for_rpc(Consumer("critic", ("tokens",), 1)))


def test_cancelled_get_leaves_no_trace() -> None:
    buf = make()

    async def go() -> None:
        await buf.put_batch([seq(0)])
        before = snapshot(buf)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.get_batch("ref_logp"), 0.05)
        waiter = asyncio.ensure_future(buf.get_batch("ref_logp"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert_unchanged(buf, before)
        await buf.put_batch([seq(1)])
        _, batch = await bounded(buf.get_batch("ref_logp"))  # the cancelled waits took nothing
        assert batch["ids"].tolist() == [0, 1]
        buf.check_invariants()

    run(go())


def test_get_returns_only_input_keys_on_device() -> None:
    buf = make(consumers=[Consumer("ref", ("tokens",), 2)])
    buf.put_batch_nowait([{**seq(i), "extra": torch.ones(3)} for i in range(2)])
    _, batch = run(buf.get_batch("ref"))
    assert set(batch.keys()) == {"ids", "tokens"} and batch.batch_size == (2,) and batch.device == torch.device("cpu")


# ---------------------------------------------------------------- jagged
def _padded(parts: list[torch.Tensor]) -> torch.Tensor:
    longest = max(p.shape[0] for p in parts)
    out = torch.zeros(len(parts), longest, *parts[0].shape[1:], dtype=parts[0].dtype)
    for i, p in enumerate(parts):
        out[i, : p.shape[0]] = p
    return out


@pytest.mark.parametrize("as_tensordict", [False, True])
def test_jagged_outputs_equal_a_per_sequence_reference(as_tensordict: bool) -> None:
    lengths = [5, 1, 9, 3]
    tokens = [torch.arange(n) + 100 * i for i, n in enumerate(lengths)]
    hidden = [torch.randn(n, 2) for n in lengths]
    buf = make(consumers=[Consumer("c", ("tokens", "hidden", "score"), 4)])
    if as_tensordict:
        samples: Any = TensorDict(
            {
                "ids": torch.arange(4),
                "tokens": torch.nested.nested_tensor(tokens, layout=torch.jagged),
                "hidden": torch.nested.nested_tensor(hidden, layout=torch.jagged),
                "score": torch.arange(4.0),
            },
            batch_size=[4],
        )
    else:
        samples = [{"ids": i, "tokens": tokens[i], "hidden": hidden[i], "score": float(i)} for i in range(4)]
    buf.put_batch_nowait(samples)
    buf.check_invariants()
    _, batch = run(buf.get_batch("c"))
    for key, parts in (("tokens", tokens), ("hidden", hidden)):
        col = batch[key]
        assert col.is_nested
        assert torch.equal(col.values(), torch.cat(parts))
        assert col.offsets().tolist() == [0, 5, 6, 15, 18]  # cu_seqlens
        assert torch.equal(col.to_padded_tensor(0), _padded(parts))
        assert all(torch.equal(a, b) for a, b in zip(col.unbind(), parts, strict=True))
    assert not batch["score"].is_nested and batch["score"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_equal_lengths_come_back_as_plain_tensors_that_do_not_alias_storage() -> None:
    buf = make(consumers=[Consumer("c", ("tokens",), 2), Consumer("d", ("tokens",), 2)], max_size=4)
    buf.put_batch_nowait([seq(0, 4), seq(1, 4)])
    _, batch = run(buf.get_batch("c"))
    assert not batch["tokens"].is_nested and batch["tokens"].shape == (2, 4)
    expected = batch["tokens"].clone()
    batch["tokens"].zero_()  # a copy: the entry "d" has not read yet is untouched
    _, other = run(buf.get_batch("d"))
    assert torch.equal(other["tokens"], expected) and bool(expected.any())


# ---------------------------------------------------------------- concurrency
def test_three_producers_two_consumers_one_amender_under_gather() -> None:
    per_producer, batch = 40, 8
    total = 3 * per_producer
    consumers = two_consumers(n_train=6, n_ref=5)
    buf = AsyncSequenceBuffer(consumers, 64)
    to_amend: asyncio.Queue[tuple[torch.Tensor, list[int]]] = asyncio.Queue()
    seen: dict[str, list[int]] = {"actor_train": [], "ref_logp": []}

    async def producer(p: int) -> None:
        rng = random.Random(p)
        ids = list(range(p * per_producer, (p + 1) * per_producer))
        for first in range(0, per_producer, batch):
            chunk = ids[first : first + batch]
            while True:
                try:
                    slots = await buf.put_batch([seq(i, rng.randint(1, 12)) for i in chunk])
                    break
                except BufferFull:
                    await asyncio.sleep(0.001)  # consumers free slots
            buf.check_invariants()
            await to_amend.put((slots, chunk))
            await asyncio.sleep(0)

    async def amender() -> None:
        done = 0
        while done < total:
            slots, chunk = await to_amend.get()
            await buf.amend_batch(slots, [reward(i) for i in chunk])
            buf.check_invariants()
            done += len(chunk)

    async def consumer(c: Consumer) -> None:
        while len(seen[c.name]) + c.n_seqs <= total:
            _, got = await buf.get_batch(c)
            assert got["ids"].shape == (c.n_seqs,)
            if "rewards" in c.input_keys:
                assert got["rewards"].tolist() == [float(i) for i in got["ids"].tolist()]
            seen[c.name].extend(got["ids"].tolist())
            buf.check_invariants()

    async def go() -> None:
        await asyncio.gather(*(producer(p) for p in range(3)), amender(), *(consumer(c) for c in consumers))

    run(go(), timeout=20)
    for c in consumers:
        expected = total - total % c.n_seqs
        assert len(seen[c.name]) == len(set(seen[c.name])) == expected, c.name
    # What is left is exactly what some consumer has not read yet.
    assert buf.size == total - len(set(seen["actor_train"]) & set(seen["ref_logp"]))
    assert sorted(buf.consumed_ids()) == sorted(set(seen["actor_train"]) & set(seen["ref_logp"]))
    buf.check_invariants()


@pytest.mark.parametrize("seed", range(4))
def test_against_a_reference_model(seed: int) -> None:
    """Random puts/amends/gets against a plain-Python model of the policy (oldest ready first, free after all)."""
    rng = random.Random(seed)
    consumers = [Consumer("a", ("tokens", "rewards"), 2), Consumer("b", ("tokens",), 3), Consumer("c", (), 1)]
    buf = AsyncSequenceBuffer(consumers, 12)
    model: dict[int, dict[str, Any]] = {}  # id -> {slot, birth, keys, read}
    next_id = 0

    async def go() -> None:
        nonlocal next_id
        for _ in range(150):
            op = rng.random()
            if op < 0.4:
                n = rng.randint(1, 4)
                births = [rng.randint(0, 50) for _ in range(n)]
                free = sorted(set(range(12)) - {e["slot"] for e in model.values()})
                if n > len(free):
                    with pytest.raises(BufferFull):
                        buf.put_batch_nowait([seq(next_id + i) for i in range(n)], births)
                else:
                    slots = await buf.put_batch([seq(next_id + i) for i in range(n)], births)
                    assert slots.tolist() == free[:n]
                    for i in range(n):
                        model[next_id + i] = {"slot": free[i], "birth": births[i], "keys": {"tokens"}, "read": set()}
                next_id += n
            elif op < 0.6 and model:
                ids = rng.sample(sorted(model), min(len(model), rng.randint(1, 3)))
                await buf.amend_batch([model[i]["slot"] for i in ids], [reward(i) for i in ids])
                for i in ids:
                    model[i]["keys"].add("rewards")
            else:
                c = rng.choice(consumers)
                ready = [i for i, e in model.items() if set(c.input_keys) <= e["keys"] and c.name not in e["read"]]
                ready.sort(key=lambda i: (model[i]["birth"], model[i]["slot"]))
                if len(ready) < c.n_seqs:
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(buf.get_batch(c), 0.001)
                else:
                    slots, got = await bounded(buf.get_batch(c))
                    want = ready[: c.n_seqs]
                    assert got["ids"].tolist() == want
                    assert slots.tolist() == [model[i]["slot"] for i in want]
                    for i in want:
                        model[i]["read"].add(c.name)
                        if len(model[i]["read"]) == len(consumers):
                            del model[i]
            buf.check_invariants()
            assert buf.size == len(model)

    run(go(), timeout=30)


# ---------------------------------------------------------------- sync and thread entry points
def test_put_batch_nowait_wakes_a_waiting_consumer() -> None:
    buf = make()

    async def go() -> None:
        waiter = asyncio.ensure_future(buf.get_batch("ref_logp"))
        await asyncio.sleep(0.01)
        buf.put_batch_nowait([seq(0), seq(1)])
        _, batch = await bounded(waiter, 2.0)
        assert batch["ids"].tolist() == [0, 1]

    run(go())


def test_put_batch_threadsafe_from_a_rollout_thread() -> None:
    buf = make(16)
    errors: list[BaseException] = []

    def rollout() -> None:
        try:
            for first in range(0, 8, 2):
                buf.put_batch_threadsafe([seq(first), seq(first + 1)], timeout=5)
            with pytest.raises(RuntimeError, match="put_batch_threadsafe"):
                buf.put_batch_nowait([seq(100)])  # not from another thread while the loop runs
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    async def go() -> list[int]:
        waiter = asyncio.ensure_future(buf.get_batch(Consumer("ref_logp", ("tokens",), 2)))
        await asyncio.sleep(0.01)  # the waiter binds the buffer to this loop
        thread = threading.Thread(target=rollout)
        thread.start()
        ids = (await bounded(waiter))[1]["ids"].tolist()
        for _ in range(3):
            ids += (await bounded(buf.get_batch("ref_logp")))[1]["ids"].tolist()
        await asyncio.to_thread(thread.join, 5)
        return ids

    assert run(go()) == list(range(8))
    assert not errors, errors
    with pytest.raises(RuntimeError, match="loop"):
        make().put_batch_threadsafe([seq(0)])


def test_check_invariants_names_an_inconsistency() -> None:
    class Corrupted(AsyncSequenceBuffer):
        def mark_read_by_everyone(self, slot: int) -> None:
            self._t.read[slot, :] = True  # an entry read by everyone but not freed (the slot table)

    buf = Corrupted([Consumer("c", ("tokens",), 1)], max_size=4)
    buf.put_batch_nowait([seq(0)])
    buf.mark_read_by_everyone(0)
    with pytest.raises(InconsistentStateError, match="not freed") as info:
        buf.check_invariants()
    assert isinstance(info.value, AssertionError)
