"""QueryFilter (AWorld's ``query_filter.QueryFilter``): rows in hand filtered with exactly the storage's query
semantics, and AWorld's own ``filter()`` checks; against aworld 0.2.6's QueryFilter where its semantics are
defined (no missing values, ``like`` without wildcards)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from objectrl_buffer.errors import InvalidArgumentError, QueryError
from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, InMemoryStorage, QueryBuilder, QueryFilter
from tests.tasks.reference import check
from tests.tasks.test_query_masks import random_query, random_row


def test_filter_keeps_what_the_storage_and_the_reference_select() -> None:
    rng = random.Random(11)
    rows = [random_row(rng, i) for i in range(300)]
    storage = InMemoryStorage(max_capacity=1000)
    storage.add_batch(rows)
    for _ in range(60):
        cond = random_query(rng).build()
        kept = QueryFilter(cond).filter(rows)
        assert [r.id for r in kept] == [r.id for r in storage.get_all(cond)], cond
        assert [r.id for r in kept] == [r.id for r in rows if check(r, cond)], cond
        assert all(a is b for a, b in zip(kept, (r for r in rows if check(r, cond)), strict=True))  # same objects
        one = rows[rng.randrange(len(rows))]
        assert QueryFilter(cond).check_condition(one) == check(one, cond)


def test_aworlds_filter_checks() -> None:
    """AWorld's tests/replay_buffer/query_filter.py ``filter()``, its payload made of plain values."""
    row = DataRow(
        exp_meta=ExpMeta(task_id="task_1", task_name="default_task_name", agent_id="agent_1", step=1,
                         execute_time=time.time()),
        exp_data=Experience(state={}, action=[{}]),
    )  # fmt: skip
    assert QueryFilter(QueryBuilder().eq("exp_meta.task_id", "task_1").build()).check_condition(row)
    assert not QueryFilter(QueryBuilder().eq("exp_meta.task_id", "task_2").build()).check_condition(row)
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").and_().eq("exp_meta.agent_id", "agent_2").build()
    assert not QueryFilter(query).check_condition(row)


def test_no_condition_keeps_everything_and_payloads_are_not_read() -> None:
    rows = [DataRow(ExpMeta(f"t{i}", "n", "a", i, 0.0), Experience(state=object())) for i in range(3)]
    assert QueryFilter(None).filter(rows) == rows and QueryFilter({}).filter(iter(rows)) == rows
    assert QueryFilter(QueryBuilder().gte("step", 1).build()).filter(rows) == rows[1:]
    assert QueryFilter(QueryBuilder().is_null("pre_agent").build()).filter(rows) == rows  # AWorld: KeyError
    assert QueryFilter(QueryBuilder().eq("step", 0).build()).filter([]) == []


def test_bad_queries_and_rows_raise_naming_them() -> None:
    row = DataRow(ExpMeta("t", "n", "a", 1, 0.0), Experience())
    with pytest.raises(QueryError, match="'between'"):
        QueryFilter({"field": "step", "op": "between", "value": 1}).check_condition(row)  # AWorld: False
    with pytest.raises(QueryError, match="nope"):
        QueryFilter(QueryBuilder().eq("exp_meta.nope", 1).build()).filter([row])
    with pytest.raises(InvalidArgumentError, match=r"exp_meta\.step"):
        QueryFilter(QueryBuilder().eq("step", 1).build()).filter([DataRow(ExpMeta("t", "n", "a", "1", 0.0), None)])


def _upstream() -> dict[str, Any]:
    try:
        from benchmarks.aworld_upstream import Unavailable, load
    except ImportError:  # pragma: no cover
        pytest.skip("benchmarks/ not importable")
    try:
        return load()
    except Unavailable as exc:
        pytest.skip(str(exc))


def test_same_rows_as_aworlds_query_filter_where_aworld_is_defined() -> None:
    up = _upstream()
    rng = random.Random(3)
    strings = ["a", "ab", "abc", "b", "zz"]
    rows = [
        DataRow(ExpMeta(f"t{rng.randint(0, 9)}", rng.choice(strings), rng.choice(strings), rng.randint(0, 5),
                        float(rng.randint(0, 9)), rng.choice(strings)), Experience(reward_t=rng.randint(-2, 2) / 2))
        for _ in range(100)
    ]  # fmt: skip
    theirs = [
        up["base"].DataRow(up["base"].ExpMeta(*(getattr(r.exp_meta, f) for f in
                           ("task_id", "task_name", "agent_id", "step", "execute_time", "pre_agent"))),
                           up["base"].Experience(state=None, actions=[], reward_t=r.exp_data.reward_t), id=r.id)
        for r in rows
    ]  # fmt: skip
    fields = ["exp_meta.task_id", "exp_meta.task_name", "exp_meta.agent_id", "exp_meta.pre_agent"]
    numbers = ["exp_meta.step", "exp_meta.execute_time", "exp_data.reward_t"]
    compared = 0
    for _ in range(150):
        ours_q, their_q = QueryBuilder(), up["query_filter"].QueryBuilder()
        for i in range(rng.randint(1, 3)):
            if i:
                op = rng.choice(["and_", "or_"])
                getattr(ours_q, op)()
                getattr(their_q, op)()
            if rng.random() < 0.5:
                field, op = rng.choice(fields), rng.choice(["eq", "ne", "in_", "not_in", "like", "not_like"])
                value: Any = rng.choice(strings) if op not in ("in_", "not_in") else rng.sample(strings, 2)
            else:
                field, op = rng.choice(numbers), rng.choice(["eq", "ne", "gt", "gte", "lt", "lte", "in_"])
                value = rng.randint(0, 5) if op != "in_" else [0, 1, 4]
            getattr(ours_q, op)(field, value)
            getattr(their_q, op)(field, value)
        cond = ours_q.build()
        assert cond == their_q.build()
        expected = [r.id for r in up["query_filter"].QueryFilter(cond).filter(theirs)]
        assert [r.id for r in QueryFilter(cond).filter(rows)] == expected, cond
        compared += 0 < len(expected) < len(rows)
    assert compared > 50
