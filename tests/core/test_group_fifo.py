"""core/group_fifo.py against a store-one-row-at-a-time model; planning changes nothing."""

from __future__ import annotations

import random

import pytest

from objectrl_buffer.core.group_fifo import GroupCounts, plan_store
from objectrl_buffer.errors import InvalidArgumentError


def test_plan_matches_a_row_by_row_model() -> None:
    rng = random.Random(1)
    counts = GroupCounts()
    model: list[tuple[str, int]] = []  # (group, row id) held, oldest first
    next_id = 0
    for _ in range(200):
        groups = [f"g{rng.randint(0, 5)}" for _ in range(rng.randint(1, 6))]
        ids = list(range(next_id, next_id + len(groups)))
        next_id += len(groups)
        plan = plan_store(counts, groups, 8)
        for g, i in zip(groups, ids, strict=False):
            while len(model) >= 8:
                oldest = next(h for h, _ in model if h != g)
                model = [(h, j) for h, j in model if h != oldest]
            model.append((g, i))
        kept = [i for i, k in zip(ids, plan.keep, strict=False) if k]
        assert kept == [i for _, i in model if i >= ids[0]]
        counts = plan.after
        assert counts.total == len(model) <= 8
        assert dict(counts.rows) == {g: sum(h == g for h, _ in model) for g in dict.fromkeys(h for h, _ in model)}


def test_a_group_over_capacity_raises_and_changes_nothing() -> None:
    counts = GroupCounts()
    counts = plan_store(counts, ["a", "a"], 3).after
    before = counts.copy()
    with pytest.raises(InvalidArgumentError, match="task 'a' would hold 4 rows"):
        plan_store(counts, ["a", "a"], 3)
    assert counts == before


def test_a_store_that_fits_plans_without_copying_and_applies_in_place() -> None:
    counts = plan_store(GroupCounts(), ["a", "b", "a"], 10).after
    plan = plan_store(counts, ["c", "a", "c", "d"], 10)
    assert plan.evicted == [] and plan.keep == [True] * 4
    after = plan.after  # a new object: the counts planned on are unchanged
    assert list(after.rows.items()) == [("a", 3), ("b", 1), ("c", 2), ("d", 1)] and after.total == 7
    assert list(counts.rows.items()) == [("a", 2), ("b", 1)] and counts.total == 3
    again = plan_store(counts, ["c", "a", "c", "d"], 10)
    applied = again.apply()  # the same bookkeeping, made in place
    assert applied is counts and applied == after
