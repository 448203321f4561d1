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
