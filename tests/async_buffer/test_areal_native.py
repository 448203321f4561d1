"""What AReaL's master needs natively (issue 26): metadata-only entries, several sequences per key, str ids,
being told when an entry is freed, and refusing a put on a full buffer without reading its samples."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, BufferFull, Consumer, Sequences
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from tests.async_buffer.helpers import bounded, run


def _rpcs() -> list[Consumer]:
    return [Consumer("actor_train", ("packed_input_ids", "rewards"), 2), Consumer("ref_inf", ("packed_input_ids",), 2)]


def test_metadata_only_entries_are_tracked_by_their_lengths() -> None:
    buf = AsyncSequenceBuffer(_rpcs(), 8)

    async def go() -> None:
        slots = await buf.put_batch(
            [{"ids": "p0", "packed_input_ids": Sequences([2, 3, 4])}, {"ids": "p1", "packed_input_ids": Sequences([5])}]
        )
        assert buf.ready("ref_inf") == 2 and buf.ready("actor_train") == 0
        _, ref = await bounded(buf.get_batch("ref_inf"))
        assert "packed_input_ids" not in ref.keys()  # noqa: SIM118  no data: only the lengths come back
        assert [t.tolist() for t in ref["seqlens", "packed_input_ids"].unbind()] == [[2, 3, 4], [5]]
        await buf.amend_batch(slots, [{"ids": f"p{i}", "rewards": Sequences([1] * n)} for i, n in enumerate((3, 1))])
        _, train = await bounded(buf.get_batch("actor_train"))
        assert train["seqlens", "rewards"].offsets().tolist() == [0, 3, 4]
        assert buf.size == 0
        buf.check_invariants()

    run(go())


def test_several_sequences_per_key_come_back_with_their_lengths() -> None:
    buf = AsyncSequenceBuffer(_rpcs(), 8)
    tokens = [torch.arange(9), torch.arange(4) + 100]
    nested = torch.nested.nested_tensor([torch.arange(3), torch.arange(1)], layout=torch.jagged)

    async def go() -> None:
        await buf.put_batch(
            [
                {
                    "ids": 0,
                    "packed_input_ids": Sequences([2, 3, 4], tokens[0]),
                    "rewards": Sequences([1, 1, 1], torch.ones(3)),
                },
                {"ids": 1, "packed_input_ids": Sequences([4], tokens[1]), "rewards": Sequences([1], torch.zeros(1))},
            ]
        )
        _, batch = await bounded(buf.get_batch("actor_train"))
        assert torch.equal(batch["packed_input_ids"].values(), torch.cat(tokens))  # packed, as AReaL's gather
        assert [t.tolist() for t in batch["seqlens", "packed_input_ids"].unbind()] == [[2, 3, 4], [4]]
        await buf.put_batch([{"ids": 2, "packed_input_ids": nested, "rewards": Sequences([1, 1], torch.ones(2))}])
        buf.check_invariants()

    run(go())
    stored = buf.state_dict()
    again = AsyncSequenceBuffer(_rpcs(), 8)
    again.load_state_dict(stored)
    again.check_invariants()
    assert again.ready("ref_inf") == 3

    async def after() -> None:
        await again.put_batch(
            [{"ids": 3, "packed_input_ids": Sequences([2], torch.arange(2)), "rewards": Sequences([1], torch.ones(1))}]
        )
        _, batch = await bounded(again.get_batch("ref_inf"))
        assert [t.tolist() for t in batch["seqlens", "packed_input_ids"].unbind()] == [[2, 3, 4], [4]]
        _, batch = await bounded(again.get_batch("ref_inf"))  # the nested tensor's sequences, then id 3
        assert [t.tolist() for t in batch["seqlens", "packed_input_ids"].unbind()] == [[3, 1], [2]]
        assert batch["packed_input_ids"].values().tolist() == [0, 1, 2, 0, 0, 1]

    run(after())


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            {"ids": 5, "packed_input_ids": torch.arange(3)},
            "Sequences",
        ),  # the key holds Sequences: one tensor is refused
        ({"ids": 5, "packed_input_ids": Sequences([2], torch.arange(2.0))}, "int64"),
        ({"ids": 5, "packed_input_ids": Sequences([2])}, "lengths only"),  # data where data was stored
        ({"ids": 5, "packed_input_ids": Sequences([1], torch.arange(1)), "seqlens": torch.ones(1)}, "reserved"),
    ],
)
def test_a_sequences_key_keeps_its_form(bad: dict[str, Any], match: str) -> None:
    buf = AsyncSequenceBuffer(_rpcs(), 8)
    buf.put_batch_nowait([{"ids": 0, "packed_input_ids": Sequences([1, 2], torch.arange(3))}])
    with pytest.raises(SchemaError, match=match):
        buf.put_batch_nowait([bad])
    assert buf.size == 1
    with pytest.raises(SchemaError, match="sum 5"):
        Sequences([2, 3], torch.arange(4))


def test_str_ids_are_native_and_survive_save_and_load(tmp_path: Path) -> None:
    buf = AsyncSequenceBuffer(_rpcs(), 8)

    async def go() -> None:
        slots = await buf.put_batch([{"ids": f"q{i}", "packed_input_ids": torch.arange(i + 1)} for i in range(2)])
        with pytest.raises(InvalidArgumentError, match="already in the buffer"):
            await buf.put_batch([{"ids": "q1", "packed_input_ids": torch.arange(1)}])
        with pytest.raises(InvalidArgumentError, match="ids are not ints"):
            await buf.put_batch([{"ids": 7, "packed_input_ids": torch.arange(1)}])
        with pytest.raises(InvalidArgumentError, match="slot 1 holds ids q1"):
            await buf.amend_batch(slots[1:], [{"ids": "q0", "rewards": torch.tensor(1.0)}])
        await buf.amend_batch(slots, [{"ids": f"q{i}", "rewards": torch.tensor(float(i))} for i in range(2)])
        _, batch = await bounded(buf.get_batch("actor_train"))
        assert batch["ids"] == ["q0", "q1"] and batch[1]["ids"] == "q1"
        await buf.put_batch([{"ids": "q9", "packed_input_ids": torch.arange(1)}])

    run(go())
    assert buf.size == 3 and buf.consumed_ids() == []
    buf.save(tmp_path / "q.ckpt")
    again = AsyncSequenceBuffer(_rpcs(), 8)
    again.load(tmp_path / "q.ckpt")
    again.check_invariants()
    _, batch = run(again.get_batch("ref_inf"))
    assert batch["ids"] == ["q0", "q1"] and again.consumed_ids() == ["q0", "q1"]
    with pytest.raises(InvalidArgumentError, match="integer or another hashable"):
        again.put_batch_nowait([{"ids": [1], "packed_input_ids": torch.arange(1)}])
    tuples = AsyncSequenceBuffer(_rpcs(), 8)
    tuples.put_batch_nowait([{"ids": ("run", 1), "packed_input_ids": torch.arange(1)}])
    with pytest.raises(InvalidArgumentError, match="int or str ids only"):
        tuples.save(tmp_path / "t.ckpt")


def test_a_caller_learns_when_an_entry_is_freed() -> None:
    freed: list[list[Hashable]] = []

    def on_free(ids: list[Hashable]) -> None:
        if ids[0] == "t0":
            raise ZeroDivisionError("a callback with a bug")
        freed.append(ids)

    buf = AsyncSequenceBuffer(_rpcs(), 8, on_free=on_free)

    async def go() -> None:
        slots = await buf.put_batch([{"ids": f"s{i}", "packed_input_ids": torch.arange(2)} for i in range(2)])
        gone = buf.wait_freed("s1")
        await bounded(buf.get_batch("ref_inf"))
        assert not gone.done() and freed == []  # read by one consumer of two: still held
        await buf.amend_batch(slots, [{"ids": f"s{i}", "rewards": torch.tensor(1.0)} for i in range(2)])
        await bounded(buf.get_batch("actor_train"))
        await bounded(gone)
        assert freed == [["s0", "s1"]]
        with pytest.raises(InvalidArgumentError, match="no entry holds id 's1'"):
            buf.wait_freed("s1")
        # a callback that raises: the entries are freed and the batch returned; the loop's handler hears it
        seen: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: seen.append(ctx))
        await buf.put_batch(
            [{"ids": f"t{i}", "packed_input_ids": torch.arange(2), "rewards": torch.tensor(0.0)} for i in range(2)]
        )
        await bounded(buf.get_batch("ref_inf"))
        _, batch = await bounded(buf.get_batch("actor_train"))
        assert batch["ids"] == ["t0", "t1"] and buf.size == 0
        assert isinstance(seen[0]["exception"], ZeroDivisionError)

    run(go())


class _Watched(Mapping[str, Any]):
    """A sample that counts how often it is read."""

    reads = 0

    def __init__(self, i: int) -> None:
        self._d = {"ids": i, "packed_input_ids": torch.arange(2)}

    def __getitem__(self, key: str) -> Any:
        _Watched.reads += 1
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        _Watched.reads += 1
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def test_a_put_that_cannot_fit_is_refused_without_reading_its_samples() -> None:
    buf = AsyncSequenceBuffer(_rpcs(), 2)
    buf.put_batch_nowait([{"ids": 0, "packed_input_ids": torch.arange(2)}])
    _Watched.reads = 0
    with pytest.raises(BufferFull):
        buf.put_batch_nowait([_Watched(1), _Watched(2)])
    assert _Watched.reads == 0 and buf.size == 1  # a retrying writer pays nothing per refusal


def test_a_jagged_batch_is_the_tensor_torchs_public_constructor_builds() -> None:
    parts = [torch.arange(n) + 10 * n for n in (3, 1, 5)]
    buf = AsyncSequenceBuffer([Consumer("ref_inf", ("packed_input_ids",), 3)], 4)
    buf.put_batch_nowait([{"ids": i, "packed_input_ids": p} for i, p in enumerate(parts)])
    _, batch = run(buf.get_batch("ref_inf"))
    got = batch["packed_input_ids"]
    want = torch.nested.nested_tensor_from_jagged(
        torch.cat(parts), torch.tensor([0, 3, 4, 9]), min_seqlen=1, max_seqlen=5
    )
    assert torch.equal(got.values(), want.values()) and torch.equal(got.offsets(), want.offsets())
    assert torch.equal(got.to_padded_tensor(-1), want.to_padded_tensor(-1))  # padded to the longest (5), not to 9
    assert [t.tolist() for t in got.unbind()] == [p.tolist() for p in parts] and batch[2]["packed_input_ids"].shape == (
        5,
    )
