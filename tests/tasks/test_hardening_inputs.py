"""Bad inputs to a task buffer: refused at the call with an error from objectrl_buffer.errors naming the
argument, the storage unchanged; queries that are merely large or deep (a 251-leaf ``or_()`` chain, a huge
bound, a LIKE pattern with many ``%``) run, and give what a plain-Python reference gives."""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.errors import InvalidArgumentError, QueryError
from objectrl_buffer.tasks import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    SharedTaskStorage,
    TaskReplayBuffer,
    TensorDictConverter,
)
from objectrl_buffer.tasks.query_filter import like_matcher
from tests.support import deadline
from tests.tasks import reference
from tests.tasks.workers import step_row


def row(task: str = "t", step: Any = 0, when: Any = 0.0, name: str = "n", **data: Any) -> DataRow:
    return DataRow(ExpMeta(task, name, "a", step, when), Experience(**data))


@pytest.fixture(params=["memory", "shared"])
def buffer(request: pytest.FixtureRequest, tmp_path: Path) -> TaskReplayBuffer:
    storage = InMemoryStorage(max_capacity=100) if request.param == "memory" else SharedTaskStorage(100, tmp_path)
    rb = TaskReplayBuffer(storage, seed=0)
    rb.store_batch([step_row(0, t, s) for t in range(3) for s in range(4)])
    return rb


def snapshot(rb: TaskReplayBuffer) -> tuple[list[str], int, list[str]]:
    storage = rb.storage
    return [r.id for r in storage.get_all()], len(rb), storage.matching_task_ids()  # type: ignore[attr-defined]


BAD_STEPS = [math.nan, math.inf, -math.inf, 1e300, 2**70, -(2**63) - 1, 2**63, 10**400]


@pytest.mark.parametrize(
    "step", BAD_STEPS, ids=lambda s: f"{s:.3g}" if isinstance(s, float) else f"int{s.bit_length()}"
)
def test_a_step_no_int64_holds_is_refused_at_store(buffer: TaskReplayBuffer, step: Any) -> None:
    before = snapshot(buffer)
    with pytest.raises(InvalidArgumentError, match=r"exp_meta\.step"):
        buffer.store(row(step=step))
    with pytest.raises(InvalidArgumentError, match=r"exp_meta\.step"):
        buffer.store_batch([row("good"), row("bad", step=step)])  # all or nothing
    assert snapshot(buffer) == before
    for task in buffer.sample_task(converter=TensorDictConverter()):  # raised ValueError/OverflowError before
        assert task["step"].dtype == torch.int64


def test_int64_steps_at_the_edges_are_kept(buffer: TaskReplayBuffer) -> None:
    buffer.store_batch([row("edge", step=2**63 - 1), row("edge", step=-(2**63), when=1.0)])
    [task] = buffer.sample_task(
        query_condition=QueryBuilder().eq("task_id", "edge").build(), converter=TensorDictConverter()
    )
    assert sorted(task["step"].tolist()) == [-(2**63), 2**63 - 1]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"when": 10**400}, r"exp_meta\.execute_time"),
        ({"reward_t": 10**400}, r"exp_data\.reward_t"),
        ({"v_t": -(10**400)}, r"exp_data\.v_t"),
        ({"state": lambda: torch.zeros(2, device="meta")}, "exp_data.state"),
        ({"actions": lambda: [torch.zeros(3).to_sparse()]}, r"exp_data.actions\[0\]"),
        ({"messages": lambda: torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8)}, "exp_data.messages"),
    ],
    ids=["execute_time", "reward_t", "v_t", "meta", "sparse", "quantized"],
)
def test_values_no_column_or_file_can_hold_are_refused(
    buffer: TaskReplayBuffer, fields: dict[str, Any], named: str
) -> None:
    before = snapshot(buffer)
    with warnings.catch_warnings():  # quantize_per_tensor is deprecated (and warns) in recent torch
        warnings.simplefilter("ignore", UserWarning)
        fields = {k: v() if callable(v) else v for k, v in fields.items()}
    with pytest.raises(InvalidArgumentError, match=named):
        buffer.store_batch([row("good"), row("bad", **fields)])
    assert snapshot(buffer) == before


@pytest.mark.parametrize("call", ["one", "batch", "batch of a str"])
@pytest.mark.parametrize("task_id", [[1], {"a": 1}, 1, None])
def test_task_ids_that_are_not_str(buffer: TaskReplayBuffer, call: str, task_id: Any) -> None:
    storage = buffer.storage
    with pytest.raises(InvalidArgumentError, match="task_id"):
        if call == "one":
            storage.get_by_task_id(task_id)
        elif call == "batch":
            storage.get_batch_by_task_ids(["w0-t0", task_id])
        else:
            storage.get_batch_by_task_ids("w0-t0")  # type: ignore[arg-type]


# ---------------------------------------------------------------- queries


def numbers_buffer() -> tuple[TaskReplayBuffer, list[DataRow]]:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=100))
    rows = [
        row(f"t{i}", step=s, when=w, reward_t=r)
        for i, (s, w, r) in enumerate(
            [(0, 0.0, 1.0), (5, math.inf, None), (-3, -math.inf, -2.5), (None, None, 7), (2**62, 1e308, 3)]
        )
    ]
    rb.store_batch(rows)
    return rb, rb.storage.get_all()


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in"])
@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1024, 3])
@pytest.mark.parametrize("field", ["step", "execute_time", "reward_t"])
def test_numbers_beyond_float64_in_queries(op: str, value: int, field: str) -> None:
    rb, rows = numbers_buffer()
    query = {"field": field, "op": op, "value": [value, 0] if op in ("in", "not_in") else value}
    expected = sum(reference.check(r, query) for r in rows)  # Python compares the int exactly
    assert rb.storage.size(query) == expected  # raised OverflowError before


def chain(leaves: int, op: str = "or_") -> dict[str, Any]:
    builder = QueryBuilder().eq("step", 0)
    for i in range(1, leaves):
        getattr(builder, op)().eq("step", i)
    return builder.build()  # type: ignore[return-value]


@pytest.mark.parametrize("leaves", [201, 251, 5000])
def test_long_builder_chains_run(leaves: int) -> None:
    rb = TaskReplayBuffer(InMemoryStorage(max_capacity=1000))
    rb.store_batch([row(f"t{s % 7}", step=s) for s in range(0, 600, 3)])
    rows = rb.storage.get_all()
    query = chain(leaves)  # built folded left: `leaves - 1` levels deep
    assert rb.storage.size(query) == sum(r.exp_meta.step < leaves for r in rows)  # "nested more than 200" before
    assert rb.storage.size(chain(leaves, "and_")) == 0
    deep = QueryBuilder().eq("step", 3)
    for _ in range(300):  # genuine nesting (nested() of nested()) runs too
        deep = QueryBuilder().nested(deep).or_().eq("step", -1)
    assert rb.storage.size(deep.build()) == 1


def test_a_query_containing_itself_raises() -> None:
    rb = TaskReplayBuffer(InMemoryStorage())
    rb.store(row())
    loop: dict[str, Any] = {"or_": [{"field": "step", "op": "eq", "value": 1}]}
    loop["or_"].append(loop)
    with pytest.raises(QueryError, match="contains itself"):
        rb.storage.size(loop)
    odd = {1: 2, "and_": []}  # keys of mixed types: sorted() raised TypeError in the message
    with pytest.raises(QueryError, match="exactly one key"):
        rb.storage.size(odd)


def test_like_with_many_percents_is_linear() -> None:
    rb = TaskReplayBuffer(InMemoryStorage())
    rb.store(row(name="a" * 40))
    start = time.perf_counter()
    with deadline(10):  # the old backtracking regex took 20 s here (12 %a: 131 s), and exponentially more below
        assert rb.storage.size(QueryBuilder().like("task_name", "%a" * 11 + "%b").build()) == 0
        assert rb.storage.size(QueryBuilder().like("task_name", "%a" * 40 + "%").build()) == 1
        assert rb.storage.size(QueryBuilder().like("task_name", "%a" * 41 + "%").build()) == 0
        assert rb.storage.size(QueryBuilder().like("task_name", "_" * 20 + "%a_a%" * 5 + "%b").build()) == 0
        long = "ab" * 50_000
        assert like_matcher("%a" * 200 + "%c")(long) is False
        assert like_matcher("%" + "ab%" * 300 + "_b")(long) is True
    assert time.perf_counter() - start < 1.0


PATTERN = st.text(alphabet="ab%_\\", max_size=8)
TEXT = st.text(alphabet="ab%_\\", max_size=10)


@settings(max_examples=400, deadline=None)
@given(PATTERN, TEXT)
def test_like_matches_the_reference_matcher(pattern: str, text: str) -> None:
    assert like_matcher(pattern)(text) == reference.like(text, pattern)


@settings(max_examples=60, deadline=None)
@given(PATTERN, st.lists(TEXT, min_size=1, max_size=6))
def test_like_queries_match_the_reference(pattern: str, names: list[str]) -> None:
    rb = TaskReplayBuffer(InMemoryStorage())
    rb.store_batch([row(f"t{i}", name=n) for i, n in enumerate(names)])
    rows = rb.storage.get_all()
    for op in ("like", "not_like"):
        query = {"field": "task_name", "op": op, "value": pattern}
        assert rb.storage.size(query) == sum(reference.check(r, query) for r in rows)
