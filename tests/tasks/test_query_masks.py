"""Compiled queries (tensor masks) select exactly the rows a plain-Python evaluator selects, and every
malformed query raises QueryError naming what is wrong, leaving the buffer as it was."""

from __future__ import annotations

import random
from typing import Any

import pytest

from objectrl_buffer.errors import QueryError
from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, InMemoryStorage, QueryBuilder
from tests.tasks.reference import check

STRINGS = ["a", "ab", "b_c", "abc", "task%1", "x\\y", "", "zz"]
FIELDS = {
    "exp_meta.task_id": "s",
    "task_name": "s",
    "exp_meta.agent_id": "s",
    "pre_agent": "s",
    "exp_meta.step": "n",
    "execute_time": "n",
    "exp_data.reward_t": "n",
    "adv_t": "n",
    "v_t": "n",
}
PATTERNS = ["a%", "%b%", "_b%", "a", "b\\_c", "%", "task\\%1", "a_c", "x\\\\y", "", "%c"]


def random_row(rng: random.Random, i: int) -> DataRow:
    def s() -> Any:
        return rng.choice([*STRINGS, None])

    def n() -> Any:
        return rng.choice([None, rng.randint(-3, 3), rng.randint(-3, 3) + 0.5])

    return DataRow(
        ExpMeta(f"t{rng.randint(0, 40)}", s(), s(), rng.randint(0, 5), rng.choice([None, float(i)]), s()),
        Experience(state={"i": i}, reward_t=n(), adv_t=n(), v_t=n()),
    )


def random_leaf(rng: random.Random, q: QueryBuilder) -> None:
    field = rng.choice(list(FIELDS))
    kind = FIELDS[field]
    ops = ["eq", "ne", "in_", "not_in", "is_null", "is_not_null"]
    ops += ["like", "not_like"] if kind == "s" else ["gt", "gte", "lt", "lte"]
    op = rng.choice(ops)
    one = (lambda: rng.choice([*STRINGS, None, 3])) if kind == "s" else (lambda: rng.choice([None, -1, 0, 2.5, 3]))
    if op in ("is_null", "is_not_null"):
        getattr(q, op)(field)
    elif op in ("in_", "not_in"):
        getattr(q, op)(field, [one() for _ in range(rng.randint(0, 3))])
    elif op in ("like", "not_like"):
        getattr(q, op)(field, rng.choice(PATTERNS))
    elif op in ("gt", "gte", "lt", "lte"):
        getattr(q, op)(field, rng.choice([-1, 0, 1.5, 3]))
    else:
        getattr(q, op)(field, one())


def random_query(rng: random.Random, depth: int = 0) -> QueryBuilder:
    q = QueryBuilder()
    for i in range(rng.randint(1, 4)):
        if i:
            getattr(q, rng.choice(["and_", "or_"]))()
        if depth < 2 and rng.random() < 0.2:
            q.nested(random_query(rng, depth + 1))
        else:
            random_leaf(rng, q)
    return q


def test_masks_equal_the_reference_on_1k_rows_and_200_queries() -> None:
    rng = random.Random(7)
    storage = InMemoryStorage(max_capacity=2000)
    rows = [random_row(rng, i) for i in range(1000)]
    storage.add_batch(rows)
    stored = storage.get_all()
    assert len(stored) == 1000
    hits = 0
    for _ in range(200):
        cond = random_query(rng).build()
        expected = [r.id for r in stored if check(r, cond)]
        got = storage.get_all(cond)
        assert [r.id for r in got] == expected, cond
        assert storage.size(cond) == len(expected)
        hits += bool(expected) and len(expected) < 1000
    assert hits > 50  # the queries discriminate


def test_like_is_sql_like_and_substring_without_wildcards() -> None:
    storage = InMemoryStorage()
    for name in ["my_task_1", "other", "task", "taskA1"]:
        storage.add(DataRow(ExpMeta(name, name, "agent", 0, 0.0), Experience()))

    def names(q: QueryBuilder) -> list[str]:
        return [r.exp_meta.task_name for r in storage.get_all(q.build())]

    assert names(QueryBuilder().like("task_name", "ask")) == ["my_task_1", "task", "taskA1"]
    assert names(QueryBuilder().like("task_name", "task_1")) == ["taskA1"]  # _ is one character
    assert names(QueryBuilder().like("task_name", "%task\\_1")) == ["my_task_1"]
    assert names(QueryBuilder().like("exp_meta.task_name", "%n%")) == []
    assert names(QueryBuilder().not_like("task_name", "t%")) == ["my_task_1", "other"]


def test_null_queries_work() -> None:
    storage = InMemoryStorage()
    storage.add(DataRow(ExpMeta("t", "n", "a", 0, 0.0, pre_agent="p"), Experience(reward_t=1.0)))
    storage.add(DataRow(ExpMeta("t", "n", "a", 1, 0.0), Experience()))
    assert storage.size(QueryBuilder().is_null("exp_meta.pre_agent").build()) == 1
    assert storage.size(QueryBuilder().is_not_null("reward_t").build()) == 1
    assert storage.size(QueryBuilder().eq("pre_agent", None).build()) == 1


BAD = [
    ({"field": "exp_meta.step", "value": 1, "op": "between"}, "between"),
    ({"field": "exp_meta.nope", "value": 1, "op": "eq"}, "nope"),
    ({"field": "exp_data.state", "value": 1, "op": "eq"}, "state"),
    (QueryBuilder().gt("exp_meta.task_id", "a").build(), "task_id"),
    (QueryBuilder().lte("agent_id", 3).build(), "agent_id"),
    (QueryBuilder().in_("exp_meta.agent_id", 3).build(), "agent_id"),
    (QueryBuilder().not_in("exp_meta.step", "abc").build(), "step"),
    (QueryBuilder().like("exp_meta.step", "1%").build(), "step"),
    (QueryBuilder().like("task_name", 3).build(), "task_name"),
    (QueryBuilder().gt("step", "3").build(), "step"),
    (QueryBuilder().eq("step", 1).and_().eq("nope", 1).build(), "nope"),
    ({"and_": [{"field": "step", "value": 1, "op": "eq"}], "or_": []}, "and_"),
    ({"field": "step", "op": "eq"}, "value"),
]


@pytest.mark.parametrize(("cond", "named"), BAD)
def test_bad_queries_raise_query_error_naming_it(cond: Any, named: str) -> None:
    storage = InMemoryStorage()
    storage.add(DataRow(ExpMeta("t", "n", "a", 0, 0.0), Experience()))
    before = [r.to_dict() for r in storage.get_all()]
    for call in (storage.size, storage.get_all, storage.matching_task_ids):
        with pytest.raises(QueryError, match=named):
            call(cond)
    with pytest.raises(ValueError):  # QueryError is a ValueError
        storage.get_paginated(1, 10, cond)
    assert [r.to_dict() for r in storage.get_all()] == before
