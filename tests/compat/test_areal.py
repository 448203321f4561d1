"""AReaL's put/amend/get cycle through objectrl_buffer.compat.areal, with AReaL's names and call shapes: the
master puts metadata-only samples of str ids (a group of responses per prompt), a reward service amends
them, two RPCs read them, the same ids come back every epoch, and the master cleans its table on free."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from objectrl_buffer.compat.areal import AsyncIOSequenceBuffer, BufferFull, SequenceSample
from tests.async_buffer.helpers import run


@dataclass
class MFCDef:  # the fields of AReaL's dfg.MFCDef the buffer reads
    name: str
    input_keys: tuple[str, ...]
    n_seqs: int


RPCS = [MFCDef("actor_train", ("packed_input_ids", "rewards"), 4), MFCDef("ref_inf", ("packed_input_ids",), 4)]
GROUP = [2, 3, 4]  # three responses per prompt


def test_the_master_cycle_with_reused_ids_every_epoch() -> None:
    table: dict[Hashable, int] = {}  # the master's own table of in-flight samples
    buf = AsyncIOSequenceBuffer(RPCS, max_size=6, on_free=lambda ids: [table.pop(i) for i in ids])
    prompts = [f"prompt-{i}" for i in range(8)]

    async def epoch(e: int) -> None:
        pending = list(prompts)

        async def master() -> None:
            while pending:
                batch = pending[:2]
                metas = [SequenceSample({"packed_input_ids"}, [p], {"packed_input_ids": [GROUP]}) for p in batch]
                try:
                    idx = await buf.put_batch(metas)
                except BufferFull:
                    await asyncio.sleep(0)
                    continue
                assert isinstance(idx, np.ndarray) and idx.dtype == np.int64
                table.update({p: e for p in batch})
                del pending[:2]
                rewards = [SequenceSample({"rewards"}, [p], {"rewards": [[1, 1, 1]]}) for p in batch]
                await buf.amend_batch(idx, rewards)

        async def reader(rpc: MFCDef) -> list[Hashable]:
            got: list[Hashable] = []
            while len(got) < len(prompts):
                idx, sample = await buf.get_batch_for_rpc(rpc)
                assert len(idx) == rpc.n_seqs and sample.keys == set(rpc.input_keys) and sample.data is None
                assert all(s == [2, 3, 4] for s in sample.seqlens["packed_input_ids"])
                got += sample.ids
            return got

        _, train, ref = await asyncio.wait_for(asyncio.gather(master(), reader(RPCS[0]), reader(RPCS[1])), 10)
        assert sorted(train) == sorted(ref) == sorted(prompts)

    for e in range(3):  # the same ids every epoch
        run(epoch(e))
        assert buf.size == 0 and table == {}
        buf.native.check_invariants()
    assert sorted(buf.native.consumed_ids()) == sorted(prompts * 3)


def test_samples_with_data_come_back_packed() -> None:
    buf = AsyncIOSequenceBuffer(RPCS, max_size=8)
    tokens = {f"p{i}": torch.arange(9) + 10 * i for i in range(4)}
    whole = SequenceSample(
        {"packed_input_ids"},
        list(tokens),
        {"packed_input_ids": [GROUP] * 4},
        data={"packed_input_ids": torch.cat(list(tokens.values()))},
    )
    idx = buf.put_batch_synced(whole.unpack())
    assert buf.size == 4 and buf.n_rpcs == 2 and buf.max_size == 8
    samples = [
        SequenceSample.from_default([p], [1], {"rewards": torch.tensor([float(i)])}) for i, p in enumerate(tokens)
    ]

    async def go() -> None:
        await buf.amend_batch(idx, samples)
        _, ref = await buf.get_batch_for_rpc(RPCS[1])
        _, train = await buf.get_batch_for_rpc(RPCS[0])
        assert ref.ids == list(tokens) and torch.equal(ref.data["packed_input_ids"], whole.data["packed_input_ids"])
        assert train.data["rewards"].tolist() == [0.0, 1.0, 2.0, 3.0] and train.seqlens["rewards"] == [[1]] * 4
        assert train.seqlens["packed_input_ids"] == [GROUP] * 4
        assert SequenceSample.gather(whole.unpack()).ids == list(tokens)

    run(go())
    assert buf.size == 0
    with pytest.raises(Exception, match="one id"):
        buf.put_batch_synced([whole])
