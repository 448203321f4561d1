"""TaskReplayBuffer: AWorld's README runs as written, capacity evicts whole tasks counted once, sampling
returns whole sorted tasks, bad rows raise and store nothing, payloads come back in their JSON form."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.tasks import (
    Converter,
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    RandomTaskSample,
    ReplayBuffer,
    TaskReplayBuffer,
    TaskSampler,
    TensorDictConverter,
)


class Observation:  # stands in for AWorld's pydantic models
    def __init__(self, content: str = "") -> None:
        self.content = content

    def model_dump(self) -> dict[str, Any]:
        return {"content": self.content}


class ActionModel(Observation):
    pass


def row(task: str, step: int, agent: str = "agent_1", name: str = "test_task", **data: Any) -> DataRow:
    return DataRow(ExpMeta(task, name, agent, step, time.time()), Experience(**data))


def fill(rb: TaskReplayBuffer, tasks: int = 5, steps: int = 10) -> None:
    for t in range(tasks):
        for s in reversed(range(steps)):
            rb.store(row(f"task_{t}", s, agent=f"agent_{t}", state=Observation(f"o{s}"), action=ActionModel("a")))


def test_readme_examples_run_as_written() -> None:
    replay_buffer = ReplayBuffer()
    data = DataRow(
        exp_meta=ExpMeta(task_id="task_1", task_name="my_task", agent_id="agent_1", step=1, execute_time=time.time()),
        exp_data=Experience(state=Observation(), action=ActionModel()),
    )
    replay_buffer.store(data)
    fill(replay_buffer)
    query_condition = QueryBuilder().eq("exp_meta.task_name", "test_task").build()
    got = replay_buffer.sample(
        sampler=RandomTaskSample(), query_condition=query_condition, converter=DefaultConverter(), batch_size=1000
    )
    assert sorted(got) == [f"task_{t}" for t in range(5)]  # fewer matches than batch_size: all of them
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    tasks = replay_buffer.sample_task(query_condition=query, batch_size=10)
    assert len(tasks) == 1 and len(tasks[0]) == 11  # task_1 of the first row shares the id with fill's task_1
    query = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
    assert len(replay_buffer.sample_task(query_condition=query, batch_size=5)) == 1


def test_sample_task_returns_whole_tasks_sorted_by_step() -> None:
    rb = TaskReplayBuffer(seed=0)
    fill(rb)
    rb.store(row("task_0", 3, agent="other"))
    tasks = rb.sample_task(query_condition=QueryBuilder().eq("agent_id", "other").build())
    assert len(tasks) == 1
    steps = [r.exp_meta.step for r in tasks[0]]
    assert len(steps) == 11 and steps == sorted(steps)  # non-matching rows of the task come too
    assert len(rb.sample_task(batch_size=3)) == 3
    assert rb.sample_task(query_condition=QueryBuilder().eq("task_id", "none").build()) == []


def test_random_task_sample_is_reproducible_and_uniform_over_tasks() -> None:
    rb = TaskReplayBuffer(seed=1)
    fill(rb, tasks=20, steps=2)

    def draw(seed: int) -> list[str]:
        return [rows[0].exp_meta.task_id for rows in rb.sample_task(sampler=RandomTaskSample(seed=seed), batch_size=5)]

    assert draw(3) == draw(3)
    assert len(set(draw(3))) == 5
    assert draw(3) != draw(4)
    counts: dict[str, int] = {}
    sampler = RandomTaskSample(seed=0)
    for _ in range(400):
        for rows in rb.sample_task(sampler=sampler, batch_size=1):
            counts[rows[0].exp_meta.task_id] = counts.get(rows[0].exp_meta.task_id, 0) + 1
    assert len(counts) == 20 and min(counts.values()) > 5


def test_default_storage_is_one_per_buffer() -> None:
    a, b = TaskReplayBuffer(), TaskReplayBuffer()
    a.store(row("t", 0))
    assert len(a) == 1 and len(b) == 0 and a.storage is not b.storage


def test_capacity_evicts_whole_oldest_task_counting_rows_once() -> None:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=6))
    for t in range(3):
        rb.store_batch([row(f"t{t}", 0), row(f"t{t}", 1)])
    assert rb.len() == 6
    rb.store(row("t3", 0))
    assert len(rb) == 5
    assert sorted({r.exp_meta.task_id for r in rb.storage.get_all()}) == ["t1", "t2", "t3"]


def test_capacity_holds_after_every_store_against_a_model() -> None:
    import random

    rng = random.Random(0)
    storage = InMemoryStorage(max_capacity=10)
    model: dict[str, int] = {}  # task -> rows, insertion ordered
    for i in range(300):
        task = f"t{rng.randint(0, 6)}"
        storage.add(row(task, i))
        while sum(model.values()) >= 10:
            oldest = next(t for t in model if t != task)
            del model[oldest]
        model[task] = model.get(task, 0) + 1
        assert len(storage) == sum(model.values()) <= 10
        got: dict[str, int] = {}
        for r in storage.get_all():
            got[r.exp_meta.task_id] = got.get(r.exp_meta.task_id, 0) + 1
        assert got == model


def test_a_task_larger_than_the_capacity_stores_nothing() -> None:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=3))
    rb.store(row("a", 0))
    with pytest.raises(InvalidArgumentError, match=r"'b'.*max_capacity=3"):
        rb.store_batch([row("b", i) for i in range(4)])
    assert [r.exp_meta.task_id for r in rb.storage.get_all()] == ["a"]


@pytest.mark.parametrize(
    ("bad", "error", "named"),
    [
        (row("t", 0, state=object()), TypeError, "exp_data.state"),
        (row("t", 0, messages=[{"x": {1, 2}}]), TypeError, r"exp_data.messages\[0\].x"),
        (DataRow(ExpMeta(1, "n", "a", 0, 0.0), Experience()), TypeError, "task_id"),  # type: ignore[arg-type]
        (DataRow(ExpMeta("t", "n", "a", "0", 0.0), Experience()), TypeError, "step"),  # type: ignore[arg-type]
        (DataRow(None, Experience()), ValueError, "exp_meta"),  # type: ignore[arg-type]
    ],
)
def test_bad_rows_raise_and_store_nothing(bad: DataRow, error: type, named: str) -> None:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=4))
    rb.store_batch([row("keep", 0), row("keep", 1)])
    before = [r.to_dict() for r in rb.storage.get_all()]
    with pytest.raises(error, match=named):
        rb.store_batch([row("new", 0), bad])
    with pytest.raises(error, match=named):
        rb.store(bad)
    assert [r.to_dict() for r in rb.storage.get_all()] == before
    with pytest.raises(ValueError, match="required"):
        rb.store_batch([])


def test_payloads_come_back_as_their_json_form_and_tensors_as_tensors() -> None:
    @dataclasses.dataclass
    class Tool:
        name: str
        args: tuple[int, ...]

    rb = TaskReplayBuffer()
    frame = np.arange(6, dtype=np.uint8).reshape(2, 3)
    original = {"obs": Observation("hi"), "frame": frame, "t": torch.ones(2)}
    rb.store(row("t", 0, state=original, actions=[Tool("search", (1, 2))], reward_t=np.float32(0.5)))
    frame[0, 0] = 99  # later changes of the caller's objects do not reach the buffer
    (got,) = rb.storage.get_all()
    assert got.exp_data.state["obs"] == {"content": "hi"}
    assert torch.equal(got.exp_data.state["frame"], torch.arange(6, dtype=torch.uint8).reshape(2, 3))
    assert got.exp_data.actions == [{"name": "search", "args": [1, 2]}]
    assert got.exp_data.reward_t == 0.5


def test_storage_interface_reads() -> None:
    storage = InMemoryStorage()
    rb = TaskReplayBuffer(storage)
    fill(rb, tasks=3, steps=4)
    assert storage.size() == 12
    q = QueryBuilder().gte("step", 2).build()
    assert [r.exp_meta.step for r in storage.get_paginated(2, 2, q)] == [3, 2]
    with pytest.raises(ValueError, match="Page"):
        storage.get_paginated(0, 2)
    assert len(storage.get_by_task_id("task_1")) == 4 and storage.get_by_task_id("nope") == []
    assert set(storage.get_bacth_by_task_ids(["task_0", "nope"])) == {"task_0"}
    assert storage.get_batch_by_task_ids(["task_2"])["task_2"][0].exp_meta.step == 3
    storage.clear()
    assert len(rb) == 0


def test_custom_sampler_and_converter_port_unchanged() -> None:
    class FirstTasks(TaskSampler):
        def sample_task_ids(self, storage: Any, batch_size: int, query_condition: Any = None) -> list[str]:
            return sorted({r.exp_meta.task_id for r in storage.get_all(query_condition)})[:batch_size]

    class Steps(Converter):
        def to_dataset_row(self, task_experience: list[DataRow]) -> list[int]:
            return [r.exp_meta.step for r in task_experience]

    rb = TaskReplayBuffer()
    fill(rb, tasks=3, steps=3)
    assert rb.sample_task(sampler=FirstTasks(), converter=Steps(), batch_size=2) == [[0, 1, 2], [0, 1, 2]]


def test_tensordict_converter() -> None:
    rb = TaskReplayBuffer(seed=0)
    for s in range(3):
        rb.store(row("t", 2 - s, state=torch.full((4,), float(s)), reward_t=s, actions=[{"tool": "x"}]))
    (td,) = rb.sample_task(converter=TensorDictConverter())
    assert isinstance(td, TensorDict) and td.batch_size == torch.Size([3])
    assert td["step"].tolist() == [0, 1, 2]
    assert td["state"].shape == (3, 4) and td["state"][:, 0].tolist() == [2.0, 1.0, 0.0]
    assert td["reward_t"].tolist() == [2.0, 1.0, 0.0]
    assert td["task_id"] == ["t", "t", "t"]
    assert td[0]["actions"] == [{"tool": "x"}]
