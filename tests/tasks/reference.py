"""A plain-Python model of task-buffer queries (no tensors), written independently of query_filter.py."""

from __future__ import annotations

import math
from typing import Any

META = {"task_id", "task_name", "agent_id", "pre_agent", "step", "execute_time"}
DATA = {"reward_t", "adv_t", "v_t"}
STRINGS = {"task_id", "task_name", "agent_id", "pre_agent"}


def value_of(row: Any, field: str) -> Any:
    name = field.split(".", 1)[1] if "." in field else field
    value = getattr(row.exp_meta, name) if name in META else getattr(row.exp_data, name)
    return None if isinstance(value, float) and math.isnan(value) else value


def like(text: str, pattern: str) -> bool:
    """SQL LIKE by recursion over the pattern (``\\`` escapes); without wildcards, substring."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            tokens.append(("lit", pattern[i + 1]))
            i += 2
            continue
        tokens.append(("any", "") if ch == "%" else ("one", "") if ch == "_" else ("lit", ch))
        i += 1
    if all(kind == "lit" for kind, _ in tokens):
        return "".join(c for _, c in tokens) in text

    def match(t: int, p: int) -> bool:
        if p == len(tokens):
            return t == len(text)
        kind, ch = tokens[p]
        if kind == "any":
            return any(match(k, p + 1) for k in range(t, len(text) + 1))
        if t == len(text):
            return False
        return (kind == "one" or text[t] == ch) and match(t + 1, p + 1)

    return match(0, 0)


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) != isinstance(b, str):
        return False
    return a == b


def check(row: Any, cond: Any) -> bool:
    if not cond:
        return True
    if "and_" in cond:
        return all(check(row, c) for c in cond["and_"])
    if "or_" in cond:
        return any(check(row, c) for c in cond["or_"])
    field, op = cond["field"], cond["op"]
    got = value_of(row, field)
    if op == "is_null":
        return got is None
    if op == "is_not_null":
        return got is not None
    want = cond["value"]
    if op in ("eq", "ne"):
        return _equal(got, want) == (op == "eq")
    if op in ("in", "not_in"):
        return any(_equal(got, w) for w in want) == (op == "in")
    if op in ("like", "not_like"):
        return got is not None and like(got, want) == (op == "like")
    if got is None:
        return False
    return {"gt": got > want, "gte": got >= want, "lt": got < want, "lte": got <= want}[op]
