"""AReaL usage patterns the async buffer must accept: empty puts, and the same sample ids put again each epoch."""

from __future__ import annotations

import pytest
import torch

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, Consumer
from objectrl_buffer.errors import InconsistentStateError, InvalidArgumentError
from tests.async_buffer.helpers import bounded, make, run, seq


def _two_readers() -> list[Consumer]:
    return [Consumer("actor", ("tokens",), 2), Consumer("ref", ("tokens",), 2)]


def test_empty_put_with_empty_birth_times_is_an_empty_batch() -> None:
    buf = make(4)
    for births in ([], (), torch.empty(0, dtype=torch.int64)):
        assert run(buf.put_batch([], birth_times=births)).tolist() == []
        assert buf.put_batch_nowait([], birth_times=births).tolist() == []
    assert buf.size == 0
    buf.check_invariants()
    with pytest.raises(InvalidArgumentError, match="birth_times"):  # a non-empty batch still needs one per sample
        run(buf.put_batch([seq(0)], birth_times=[]))
    assert buf.size == 0


def test_same_ids_put_again_every_epoch_pass_the_invariants() -> None:
    buf = make(8, consumers=_two_readers())

    async def go() -> None:
        for epoch in range(3):
            await buf.put_batch([seq(i) for i in range(4)])
            buf.check_invariants()
            for _ in range(2):
                for name in ("actor", "ref"):
                    await bounded(buf.get_batch(name))
                    buf.check_invariants()
            assert buf.size == 0
            assert sorted(buf.consumed_ids()) == sorted(list(range(4)) * (epoch + 1))
        # an id put again while its previous entry is partly read: allowed once that entry is freed
        await buf.put_batch([seq(0), seq(1)])
        await bounded(buf.get_batch("actor"))
        buf.check_invariants()

    run(go())


def test_saved_and_loaded_reused_ids_pass_the_invariants() -> None:
    buf = make(8, consumers=_two_readers())

    async def go() -> None:
        for _ in range(2):
            await buf.put_batch([seq(0), seq(1)])
            await bounded(buf.get_batch("actor"))
            await bounded(buf.get_batch("ref"))
        await buf.put_batch([seq(0)])

    run(go())
    other = make(8, consumers=_two_readers())
    other.load_state_dict(buf.state_dict())
    other.check_invariants()
    assert other.consumed_ids() == [0, 1, 0, 1]


def test_an_entry_consumed_twice_is_still_caught() -> None:
    class Corrupted(AsyncSequenceBuffer):
        def consume_again(self, sample_id: int) -> None:
            self._t.consumed.append(sample_id)  # one entry recorded as consumed twice (a double free)

    buf = Corrupted(_two_readers(), max_size=8)

    async def go() -> None:
        for _ in range(2):  # id 0 put, consumed, put again and consumed again: consistent
            await buf.put_batch([seq(0), seq(1)])
            await bounded(buf.get_batch("actor"))
            await bounded(buf.get_batch("ref"))
        buf.check_invariants()

    run(go())
    buf.consume_again(0)  # a third consumption of an id put twice
    with pytest.raises(InconsistentStateError, match="consumed twice"):
        buf.check_invariants()
    fresh = Corrupted(_two_readers(), max_size=8)
    fresh.put_batch_nowait([seq(5)])
    fresh.consume_again(5)  # consumed while its only entry is still stored
    with pytest.raises(InconsistentStateError, match="consumed twice"):
        fresh.check_invariants()
