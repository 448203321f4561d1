"""Property test: random add / add_batch / reset sequences against a plain Python model of the ring."""

from __future__ import annotations

import shutil
import tempfile

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer


class RingModel:
    """The ring as a list of row ids by slot, a pointer and a size: what ObjectRL's counters mean."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list[int | None] = [None] * capacity
        self.pointer = 0
        self.size = 0

    def add(self, row: int) -> None:
        self.slots[self.pointer] = row
        self.pointer = (self.pointer + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def oldest_to_newest(self) -> list[int | None]:
        return [self.slots[(self.pointer - self.size + i) % self.capacity] for i in range(self.size)]


def rows(first: int, n: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(first, first + n)
    return {"id": ids, "x": torch.stack([ids.float(), -ids.float()], dim=1)}


class RingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="objectrl_buffer-prop-")
        self.next_id = 0

    @initialize(capacity=st.integers(1, 7))
    def start(self, capacity: int) -> None:
        self.rb = ReplayBuffer("cpu", "cpu", capacity, seed=0, storage_dir=self.folder)
        self.model = RingModel(capacity)

    @rule(as_tensordict=st.booleans())
    def add(self, as_tensordict: bool) -> None:
        batch = rows(self.next_id, 1)
        row = {"id": int(batch["id"][0]), "x": batch["x"][0]}
        self.rb.add(TensorDict(row, batch_size=[]) if as_tensordict else row)
        self.model.add(self.next_id)
        self.next_id += 1

    @rule(n=st.integers(0, 16), as_tensordict=st.booleans())
    def add_batch(self, n: int, as_tensordict: bool) -> None:
        batch = rows(self.next_id, n)
        self.rb.add_batch(TensorDict(batch, batch_size=[n]) if as_tensordict else batch)
        for i in range(n):
            self.model.add(self.next_id + i)
        self.next_id += n

    @rule(new_capacity=st.none() | st.integers(1, 7))
    def reset(self, new_capacity: int | None) -> None:
        self.rb.reset(new_capacity)
        self.model = RingModel(self.model.capacity if new_capacity is None else new_capacity)

    @precondition(lambda self: self.model.size > 0)
    @rule(data=st.data())
    def sample(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, 10))
        out = self.rb.sample_batch(k)
        assert out.batch_size == (k,)
        for slot, row_id in zip(out["index"].tolist(), out["id"].tolist(), strict=True):
            assert self.model.slots[slot] == row_id

    @invariant()
    def counters_match(self) -> None:
        model, rb = self.model, self.rb
        assert rb.buffer_size == model.capacity
        assert len(rb) == rb.size == rb.data_size == model.size
        assert rb.pointer == model.pointer

    @invariant()
    def contents_match(self) -> None:
        model, rb = self.model, self.rb
        if model.size == 0:
            return
        everything = rb.sample_all()
        assert everything["id"].tolist() == model.oldest_to_newest()
        assert torch.equal(everything["x"][:, 0], everything["id"].float())
        by_slot = rb.sample_by_index(range(model.size))
        assert by_slot["id"].tolist() == model.slots[: model.size]
        assert by_slot["index"].tolist() == list(range(model.size))

    def teardown(self) -> None:
        if hasattr(self, "rb"):
            self.rb.close()
        shutil.rmtree(self.folder, ignore_errors=True)


RingMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_ring_against_model = RingMachine.TestCase
