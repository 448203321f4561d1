"""QueryBuilder.build() gives exactly AWorld 0.2.6's dicts: the README's three shapes, 200 recorded random
chains, and the same chains against upstream's builder itself when its wheel can be had."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer.tasks import QueryBuilder
from tests.tasks.chains import random_chain, replay

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "aworld_query_builder.json").read_text())["cases"]


def _upstream_builder() -> Any:
    try:
        from benchmarks.aworld_upstream import Unavailable, load
    except ImportError:  # pragma: no cover
        pytest.skip("benchmarks/ not importable")
    try:
        return load()["query_filter"].QueryBuilder
    except Unavailable as exc:
        pytest.skip(str(exc))


def test_readme_shapes() -> None:
    assert QueryBuilder().eq("exp_meta.task_id", "123").build() == {
        "field": "exp_meta.task_id",
        "value": "123",
        "op": "eq",
    }
    assert QueryBuilder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build() == {
        "and_": [
            {"field": "exp_meta.task_id", "value": "123", "op": "eq"},
            {"field": "exp_meta.agent_id", "value": "456", "op": "eq"},
        ]
    }
    nested = (
        QueryBuilder()
        .eq("exp_meta.task_id", "123")
        .and_()
        .nested(QueryBuilder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
        .build()
    )
    assert nested == {
        "and_": [
            {"field": "exp_meta.task_id", "value": "123", "op": "eq"},
            {
                "or_": [
                    {"field": "exp_meta.agent_id", "value": "111", "op": "eq"},
                    {"field": "exp_meta.agent_id", "value": "222", "op": "eq"},
                ]
            },
        ]
    }


def test_left_to_right_folding_and_null_leaves() -> None:
    a, b, c = ({"field": f, "value": 1, "op": "eq"} for f in "abc")
    built = QueryBuilder().eq("a", 1).and_().eq("b", 1).or_().eq("c", 1).build()
    assert built == {"or_": [{"and_": [a, b]}, c]}
    assert QueryBuilder().is_null("x").build() == {"field": "x", "op": "is_null"}
    assert QueryBuilder().in_("x", [1]).build()["op"] == "in"


@pytest.mark.parametrize("builder", [QueryBuilder(), QueryBuilder().eq("a", 1).eq("b", 2), QueryBuilder().and_()])
def test_operand_operator_mismatch(builder: QueryBuilder) -> None:
    with pytest.raises(ValueError, match="Mismatch between condition and operator counts"):
        builder.build()


def test_recorded_upstream_chains() -> None:
    assert len(RECORDED) == 200
    for case in RECORDED:
        builder = replay(QueryBuilder, case["calls"])
        if "error" in case:
            with pytest.raises(ValueError, match=case["error"]):
                builder.build()
        else:
            assert builder.build() == case["built"], case["calls"]


def test_random_chains_against_upstream_builder() -> None:
    upstream = _upstream_builder()
    rng = random.Random(2024)
    for i in range(200):
        calls = random_chain(rng, valid=i % 7 != 0)
        try:
            expected: Any = replay(upstream, calls).build()
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                replay(QueryBuilder, calls).build()
            continue
        assert replay(QueryBuilder, calls).build() == expected, calls
