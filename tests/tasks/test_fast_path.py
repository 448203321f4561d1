"""The store fast path (JSON-native payloads copied by a type walk, columns built per batch) stores exactly
what the general path stores: same values, same exact types, same column values, copies decoupled from the
caller's objects; a batch store equals the same rows stored one by one."""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from unittest import mock

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, InMemoryStorage, rows
from objectrl_buffer.tasks.table import TaskTable


@dataclasses.dataclass
class Point:
    x: int
    y: Any


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
# leaves that are not JSON-native: each sends its whole field down the general path
_OTHER = st.one_of(
    st.integers(-5, 5).map(np.int64),
    st.floats(-1, 1).map(np.float32),
    st.lists(st.integers(-3, 3), max_size=3).map(lambda v: torch.tensor(v, dtype=torch.int64)),
    st.lists(st.floats(-1, 1), max_size=3).map(lambda v: np.array(v, dtype=np.float64)),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.builds(Point, st.integers(), st.text(max_size=3)),
    st.dictionaries(st.integers(-3, 3), st.integers(), max_size=2),
)


def payloads(native_only: bool) -> st.SearchStrategy[Any]:
    leaves = _SCALARS if native_only else st.one_of(_SCALARS, _OTHER)
    return st.recursive(
        leaves,
        lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=4), kids, max_size=4)),
        max_leaves=12,
    )


def same(a: Any, b: Any) -> bool:
    """Equal with exactly the same types all the way down (NaN equals NaN; tensors by dtype, shape, values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, DataRow | ExpMeta | Experience):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def shares_containers(stored: Any, given_: Any) -> bool:
    """True when a list or dict of ``given_`` is the very object in ``stored`` (not a copy)."""
    if isinstance(given_, list | dict) and stored is given_:
        return True
    if isinstance(given_, dict) and isinstance(stored, dict):
        return any(shares_containers(stored.get(str(k)), v) for k, v in given_.items())
    if isinstance(given_, list) and isinstance(stored, list):
        return any(shares_containers(s, g) for s, g in zip(stored, given_, strict=False))
    return False


def general_path() -> Any:
    """Turn the fast path off: every payload goes through the general ``json_form`` walk."""

    def never(value: Any, depth: int = 0) -> Any:
        raise rows.NotPlain

    return mock.patch.object(rows, "plain_copy", never)


def a_row(i: int, state: Any, actions: Any, reward: Any, messages: Any) -> DataRow:
    meta = ExpMeta(f"task_{i // 3}", f"name_{i % 2}", f"agent_{i % 4}", i % 3, float(i), None if i % 2 else "pre")
    return DataRow(meta, Experience(state, actions, reward, None, None, messages), id=f"id{i}")


@settings(max_examples=150, deadline=None)
@given(
    state=payloads(native_only=False),
    actions=payloads(native_only=True),
    messages=payloads(native_only=False),
    reward=st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-9, 9), payloads(native_only=True)),
)
def test_fast_and_general_paths_store_identical_rows(state: Any, actions: Any, messages: Any, reward: Any) -> None:
    row = a_row(1, state, actions, reward, messages)
    fast, fast_values = rows.normalize_row(row)
    with general_path():
        slow, slow_values = rows.normalize_row(row)
    assert same(fast, slow)
    assert same(list(fast_values), list(slow_values))
    for name in ("state", "actions", "messages"):
        assert not shares_containers(getattr(fast.exp_data, name), getattr(row.exp_data, name))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(payloads(native_only=False), payloads(native_only=True)), min_size=1, max_size=12))
def test_batch_store_equals_general_one_by_one(batch: list[tuple[Any, Any]]) -> None:
    data = [a_row(i, s, a, 0.5 if i % 2 else None, None) for i, (s, a) in enumerate(batch)]
    fast = InMemoryStorage(5)
    fast.add_batch(data)
    with general_path():
        slow = InMemoryStorage(5)
        for r in data:
            slow.add(r)
    assert same(fast.get_all(), slow.get_all())
    ft, st_ = fast.get_table(), slow.get_table()
    for name in rows.META_STRINGS:
        f_codes, f_vocab = ft.string_column(name)
        s_codes, s_vocab = st_.string_column(name)
        assert [f_vocab.string(c) for c in f_codes.tolist()] == [s_vocab.string(c) for c in s_codes.tolist()]
    for name in rows.NUMERIC:
        assert torch.equal(ft.number_column(name).nan_to_num(-7.0), st_.number_column(name).nan_to_num(-7.0))
    assert ft.counts == st_.counts


def test_fast_path_copies_so_later_caller_changes_do_not_leak() -> None:
    state = {"obs": [1, 2, {"k": "v"}]}
    actions = [{"tool": "search", "args": {"q": 1}}]
    rb = InMemoryStorage(10)
    rb.add_batch([a_row(0, state, actions, 0.5, None)])
    state["obs"][2]["k"] = "changed"  # type: ignore[index]
    state["new"] = 1  # type: ignore[assignment]
    actions[0]["args"]["q"] = 2  # type: ignore[index]
    actions.append({})
    stored = rb.get_all()[0].exp_data
    assert stored.state == {"obs": [1, 2, {"k": "v"}]}
    assert stored.actions == [{"tool": "search", "args": {"q": 1}}]


def test_fast_path_leaves_bad_payloads_to_the_general_errors() -> None:
    import pytest

    class Opaque:
        pass

    deep: Any = []
    for _ in range(200):
        deep = [deep]
    for bad, named in ((Opaque(), "exp_data.state.a[1]"), (deep, "nested more than")):
        storage = InMemoryStorage(10)
        payload = {"a": [1, bad]} if isinstance(bad, Opaque) else bad
        with pytest.raises(TypeError, match=named.replace("[", r"\[").replace(".", r"\.")):
            storage.add_batch([a_row(0, None, None, None, None), a_row(1, payload, None, None, None)])
        assert storage.size() == 0 and storage.get_table().n == 0


def test_prepare_returns_columns_in_row_order() -> None:
    data = [a_row(i, None, None, float(i), None) for i in range(4)]
    stored, values = TaskTable.prepare(data)
    assert [r.id for r in stored] == ["id0", "id1", "id2", "id3"]
    assert [v[0] for v in values] == ["task_0", "task_0", "task_0", "task_1"]
    assert [v[6] for v in values] == [0.0, 1.0, 2.0, 3.0]
