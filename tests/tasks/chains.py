"""Random QueryBuilder call chains, replayable on any builder class (ours or AWorld's)."""

from __future__ import annotations

import random
from typing import Any

FIELDS = ["exp_meta.task_id", "exp_meta.agent_id", "task_name", "exp_meta.step", "reward_t", "exp_meta.pre_agent"]
LEAVES = ["eq", "ne", "gt", "gte", "lt", "lte", "in_", "not_in", "like", "not_like"]


def random_chain(rng: random.Random, depth: int = 0, valid: bool = True) -> list[list[Any]]:
    """``[[method, *args], ...]``; a nested builder is ``["nested", chain]``. ``valid=False`` may drop or add
    an operator (a chain whose build() must raise)."""
    n = rng.randint(1, 4)
    calls: list[list[Any]] = []
    for i in range(n):
        if i:
            calls.append([rng.choice(["and_", "or_"])])
        kind = rng.random()
        if kind < 0.15 and depth < 2:
            calls.append(["nested", random_chain(rng, depth + 1)])
        elif kind < 0.3:
            calls.append([rng.choice(["is_null", "is_not_null"]), rng.choice(FIELDS)])
        else:
            method = rng.choice(LEAVES)
            value: Any = rng.choice([rng.randint(0, 9), f"v{rng.randint(0, 9)}", None])
            if method in ("in_", "not_in"):
                value = [rng.randint(0, 9), f"v{rng.randint(0, 3)}"]
            calls.append([method, rng.choice(FIELDS), value])
    if not valid:
        if rng.random() < 0.5 or n == 1:
            calls.append([rng.choice(["and_", "or_"])])
        else:
            calls.pop(next(i for i, c in enumerate(calls) if c[0] in ("and_", "or_")))
    return calls


def replay(builder_cls: type, calls: list[list[Any]]) -> Any:
    builder = builder_cls()
    for method, *args in calls:
        if method == "nested":
            args = [replay_builder(builder_cls, args[0])]
        getattr(builder, method)(*args)
    return builder


def replay_builder(builder_cls: type, calls: list[list[Any]]) -> Any:
    return replay(builder_cls, calls)
