"""A rejected call changes nothing: random calls across the public API of ReplayBuffer and
PrioritizedReplayBuffer, each with one random bad argument (the others good), must raise a class from
``objectrl_buffer.errors`` whose message names the argument (or the key / path it is about), and leave
the buffer byte-identical: every stored byte of every slot, the ring counters, the schema, the
generator state, the epoch iterator, ``shuffle`` and the priorities.

Bad values come in two kinds: of the wrong type (refused whatever the buffer holds, an empty buffer
included: arguments are checked before the buffer's state) and out of range for what the buffer holds
(drawn only when it holds rows: on an empty buffer ``EmptyBufferError`` is the right answer to those).
"""

from __future__ import annotations

import math
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer, errors
from objectrl_buffer.core.validate import MAX_SIZE
from tests.support import assert_same, fill_rows, full_snapshot, one_row, rows

CAPACITY = 8

# ---------------------------------------------------------------------------------------- bad values
NOT_AN_INT = [2.5, 2.0, "3", b"3", None, True, False, [2], (2,), 1 + 0j, math.nan, math.inf, object(),
              np.float64(2.0), torch.tensor([1, 2]), torch.tensor(2.0)]  # fmt: skip
BAD_SIZE_TYPED = st.one_of(
    st.sampled_from(NOT_AN_INT), st.integers(max_value=0), st.integers(min_value=MAX_SIZE + 1, max_value=2**200)
)
#: for arguments where ``None`` means "not given"
BAD_OPTIONAL_SIZE = BAD_SIZE_TYPED.filter(lambda value: value is not None)
NOT_A_REAL = ["0.9", None, True, 1 + 0j, [0.9], object(), torch.tensor(0.5)]
BAD_GAMMA = st.one_of(
    st.sampled_from([*NOT_A_REAL, math.nan, math.inf, -math.inf]),
    st.floats(max_value=-1e-9),
    st.floats(min_value=1.000001, allow_infinity=False),
)
BAD_INDICES_TYPED = st.sampled_from(
    [[0.5], [True], "a", None, [[0, 1], [2]], 1.5, [1 + 0j], torch.tensor([0.5]), torch.tensor([True]),
     np.array([0.5]), object(), [None], ["0"], {"a": 1}, [0, 2**70], torch.tensor([0.0, 1.0])]
)  # fmt: skip
BAD_FIELDS_TYPED = st.sampled_from([None, 5, [5], [("state", 5)], [None], 3.0, [[]], b"state", object()])
BAD_DONE_KEY_TYPED = st.sampled_from([5, 3.0, ["terminated"], (5,), b"terminated", True, object()])
BAD_PRIORITY = st.sampled_from(
    [[-1.0], [math.nan], [math.inf], "a", [1.0, 2.0, 3.0], None, object(), [1 + 0j], torch.tensor([math.nan]),
     np.array([-1.0]), [[1.0, 2.0]], [True + 0j], torch.tensor([1e308]) * 10]
)  # fmt: skip
BAD_PATH_TYPED = st.sampled_from(["", 5, None, b"run", 3.0, ["run"], "folder/", object()])
BAD_ALPHA = st.sampled_from([-0.5, math.nan, math.inf, "1", None, True, 1 + 0j])
BAD_BETA = st.sampled_from([-0.1, 1.5, math.nan, "1", None, True])


def _row(**changes: Any) -> dict[str, Any]:
    row = one_row(100)
    for key, value in changes.items():
        if value is None:
            del row[key]
        else:
            row[key] = value
    return row


def _batch(**changes: Any) -> dict[str, Any]:
    batch: dict[str, Any] = rows(100, 3)
    for key, value in changes.items():
        if value is None:
            del batch[key]
        else:
            batch[key] = value
    return batch


# (bad write, what the message must name): typed ones fail on any buffer, schema ones against the stored schema
BAD_ROWS_TYPED = [
    ([1, 2], "mapping"), ("state", "mapping"), (3.0, "mapping"), (torch.zeros(3), "mapping"), (None, "mapping"),
    ({}, "key"), ({"index": 3}, "key"), (TensorDict(rows(0, 2), [2]), "add_batch"),
    (_row(step=10**400), "step"), (_row(reward=torch.tensor(1.0, device="meta")), "reward"),
]  # fmt: skip
BAD_ROWS_SCHEMA = [
    (_row(state=torch.zeros(5)), "state"), (_row(reward=None), "reward"), (_row(bonus=1.0), "bonus"),
    (_row(step=2.5), "step"), (_row(frame=torch.full((3, 5, 5), 300)), "frame"),
    (_row(state=torch.zeros(4, dtype=torch.complex64)), "state"), (_row(step=np.float32(3.0)), "step"),
    (_row(value=np.array([1.0, 2.0])), "value"),
]  # fmt: skip
BAD_BATCHES_TYPED = [
    ([1, 2], "mapping"), (TensorDict(rows(0, 4), [4]).reshape(2, 2), "batch_size"), (None, "mapping"),
    (_batch(step=torch.arange(4)), "step"), ({"a": 1.0}, ("'a'", "batch")),
    (_batch(step=np.array([2**70, 0, 0], dtype=object)), "step"),
    (_batch(reward=torch.zeros(3, device="meta")), "reward"),
]  # fmt: skip
BAD_BATCHES_SCHEMA = [
    (_batch(state=torch.zeros(3, 5)), "state"), (_batch(reward=None), "reward"),
    (_batch(bonus=torch.ones(3)), "bonus"), (_batch(frame=np.full((3, 3, 5, 5), 300)), "frame"),
    (_batch(step=np.array([2**40, 1, 2], dtype=np.float64) + 0.5), "step"),
    (_batch(terminated=torch.full((3,), 2)), "terminated"),
]  # fmt: skip


# ---------------------------------------------------------------------------------------- calls
@dataclass(frozen=True, repr=False)
class Case:
    """One public method with one argument made bad.

    ``call(rb, value, tmp)`` makes the call; ``typed`` draws values refused on any buffer, ``ranged``
    (given the buffer) values refused only against what it holds; ``names(value, tmp)`` what the message
    must contain (any of them)."""

    name: str
    call: Callable[[ReplayBuffer, Any, pathlib.Path], Any]
    typed: st.SearchStrategy[Any] | None
    ranged: Callable[[ReplayBuffer], st.SearchStrategy[Any]] | None
    names: Callable[[Any, pathlib.Path], tuple[str, ...]]
    per_only: bool = False

    def __repr__(self) -> str:
        return self.name


def named(*words: str) -> Callable[[Any, pathlib.Path], tuple[str, ...]]:
    return lambda value, tmp: words


def valid_index(rb: ReplayBuffer) -> list[int]:
    return [0] if len(rb) else []


def out_of_range(rb: ReplayBuffer) -> st.SearchStrategy[Any]:
    n = len(rb)
    bad = st.one_of(st.integers(max_value=-1, min_value=-(2**62)), st.integers(min_value=n, max_value=2**62))
    return st.one_of(bad.map(lambda i: [i]), st.lists(bad, min_size=1, max_size=3).map(torch.tensor), bad)


def written(value: Any, tmp: pathlib.Path) -> tuple[str, ...]:
    return value[1] if isinstance(value[1], tuple) else (value[1],)


def a_path(kind: str, tmp: pathlib.Path) -> Any:
    """A path that names no usable checkpoint (a missing folder, a missing file, a corrupt one, a folder)."""
    if kind == "corrupt":
        (tmp / "corrupt.metadata").write_bytes(b"\x00garbage" * 8)
    if kind == "folder.metadata":
        (tmp / "folder.metadata").mkdir(exist_ok=True)
    return {"no-folder": tmp / "no" / "such" / "run", "missing": tmp / "missing", "corrupt": tmp / "corrupt",
            "folder.metadata": tmp / "folder"}[kind]  # fmt: skip


SAVE_PATHS = st.one_of(BAD_PATH_TYPED, st.sampled_from(["no-folder", "folder.metadata"]))
LOAD_PATHS = st.one_of(BAD_PATH_TYPED, st.sampled_from(["no-folder", "missing", "corrupt", "folder.metadata"]))


def resolve(value: Any, tmp: pathlib.Path) -> Any:
    names = ("no-folder", "missing", "corrupt", "folder.metadata")
    return a_path(value, tmp) if isinstance(value, str) and value in names else value


def path_message(value: Any, tmp: pathlib.Path) -> tuple[str, ...]:
    resolved = resolve(value, tmp)
    return ("path",) if not isinstance(resolved, pathlib.Path) else (str(resolved),)


CASES = [
    Case("add", lambda rb, v, t: rb.add(v[0]), st.sampled_from(BAD_ROWS_TYPED),
         lambda rb: st.sampled_from(BAD_ROWS_SCHEMA), written),
    Case("add_batch", lambda rb, v, t: rb.add_batch(v[0]), st.sampled_from(BAD_BATCHES_TYPED),
         lambda rb: st.sampled_from(BAD_BATCHES_SCHEMA), written),
    Case("sample_batch(batch_size)", lambda rb, v, t: rb.sample_batch(v), BAD_SIZE_TYPED, None, named("batch_size")),
    Case("sample_random", lambda rb, v, t: rb.sample_random(v), BAD_SIZE_TYPED, None, named("batch_size")),
    Case("sample_batch(n_step)", lambda rb, v, t: rb.sample_batch(2, n_step=v), BAD_OPTIONAL_SIZE, None,
         named("n_step")),
    Case("sample_batch(gamma)", lambda rb, v, t: rb.sample_batch(2, n_step=3, gamma=v), BAD_GAMMA, None,
         named("gamma")),
    Case("sample_batch(recent)", lambda rb, v, t: rb.sample_batch(2, recent=v), BAD_OPTIONAL_SIZE, None,
         named("recent")),
    Case("sample_by_index", lambda rb, v, t: rb.sample_by_index(v), BAD_INDICES_TYPED, out_of_range,
         named("indices", "index")),
    Case("sample_by_index_fields(indices)", lambda rb, v, t: rb.sample_by_index_fields(v, ["state"]),
         BAD_INDICES_TYPED, out_of_range, named("indices", "index")),
    Case("sample_by_index_fields(fields)", lambda rb, v, t: rb.sample_by_index_fields(valid_index(rb), v),
         BAD_FIELDS_TYPED, lambda rb: st.sampled_from(["nope", ["state", "nope"], [("state", "x")]]),
         named("fields", "nope", "'state', 'x'")),
    Case("sample_slices(num_slices)", lambda rb, v, t: rb.sample_slices(v, 2), BAD_SIZE_TYPED, None,
         named("num_slices")),
    Case("sample_slices(slice_len)", lambda rb, v, t: rb.sample_slices(2, v),
         st.one_of(BAD_SIZE_TYPED, st.integers(CAPACITY + 1, 2**40)), None, named("slice_len")),
    Case("sample_slices(done_key)", lambda rb, v, t: rb.sample_slices(2, 2, done_key=v), BAD_DONE_KEY_TYPED,
         lambda rb: st.sampled_from(["nope", ("nope",)]), named("done_key", "nope")),
    Case("calculate_num_batches", lambda rb, v, t: rb.calculate_num_batches(v), BAD_SIZE_TYPED, None,
         named("batch_size")),
    Case("create_epoch_iterator(batch_size)", lambda rb, v, t: rb.create_epoch_iterator(v), BAD_SIZE_TYPED, None,
         named("batch_size")),
    Case("create_epoch_iterator(n_epochs)", lambda rb, v, t: rb.create_epoch_iterator(2, v), BAD_SIZE_TYPED, None,
         named("n_epochs")),
    Case("create_epoch_iterator(recent)", lambda rb, v, t: rb.create_epoch_iterator(2, recent=v), BAD_OPTIONAL_SIZE,
         None, named("recent")),
    Case("get_steps_and_iterator(n_epochs)", lambda rb, v, t: rb.get_steps_and_iterator(v, 5, 2),
         st.sampled_from(NOT_AN_INT[:-1]), None, named("n_epochs")),
    Case("get_steps_and_iterator(max_iter)", lambda rb, v, t: rb.get_steps_and_iterator(0, v, 2),
         st.sampled_from(NOT_AN_INT[:-1]), None, named("max_iter")),
    Case("get_steps_and_iterator(batch_size)", lambda rb, v, t: rb.get_steps_and_iterator(v[0], 5, v[1]),
         st.tuples(st.sampled_from([0, 1, 2]), BAD_SIZE_TYPED), None, named("batch_size")),
    Case("get_steps_and_iterator(recent)", lambda rb, v, t: rb.get_steps_and_iterator(v[0], 5, 2, recent=v[1]),
         st.tuples(st.sampled_from([0, 1]), BAD_OPTIONAL_SIZE), None, named("recent")),
    Case("reset", lambda rb, v, t: rb.reset(v), BAD_OPTIONAL_SIZE, None, named("buffer_size")),
    Case("save", lambda rb, v, t: rb.save(resolve(v[0], t), data=v[1]), st.tuples(SAVE_PATHS, st.booleans()), None,
         lambda v, t: path_message(v[0], t)),
    Case("load", lambda rb, v, t: rb.load(resolve(v, t)), LOAD_PATHS, None, path_message),
    Case("update_priority(index)", lambda rb, v, t: rb.update_priority(v, [1.0]), BAD_INDICES_TYPED, out_of_range,
         named("index"), per_only=True),
    Case("update_priority(priority)", lambda rb, v, t: rb.update_priority(valid_index(rb), v), None,
         lambda rb: BAD_PRIORITY, named("priorit"), per_only=True),
    Case("alpha", lambda rb, v, t: setattr(rb, "alpha", v), BAD_ALPHA, None, named("alpha"), per_only=True),
    Case("beta", lambda rb, v, t: setattr(rb, "beta", v), BAD_BETA, None, named("beta"), per_only=True),
]  # fmt: skip


def exact_state(rb: ReplayBuffer) -> dict[str, Any]:
    """Every byte the buffer holds and every counter: :func:`full_snapshot` plus the raw columns of every
    slot (not only the live ones), the ring state and, for PER, the priorities."""
    state = full_snapshot(rb)
    state["columns"] = {key: column.clone() for key, column in rb.engine.storage.columns.items()}
    state["ring"] = rb.engine.ring.state()
    state["epoch_iterator"] = id(rb.epoch_iterator)
    if isinstance(rb, PrioritizedReplayBuffer):
        state["priorities"] = rb.priority_state()
        state["settings"] = (rb.alpha, rb.beta, rb.eps)
    return state


@pytest.fixture(scope="module")
def workdir() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield pathlib.Path(tmp)


def build(cls: type[ReplayBuffer], n_rows: int, with_iterator: bool, storage: pathlib.Path) -> ReplayBuffer:
    rb = cls("cpu", "cpu", CAPACITY, seed=3, storage_dir=storage)
    fill_rows(rb, n_rows)
    if isinstance(rb, PrioritizedReplayBuffer) and n_rows:
        rb.update_priority(list(range(len(rb))), [0.5 + i for i in range(len(rb))])
    if with_iterator and n_rows:
        rb.create_epoch_iterator(3, shuffle=True)
    return rb


# REJECTED_EXAMPLES=5000 for a longer hunt
@settings(
    max_examples=int(os.environ.get("REJECTED_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    per=st.booleans(),
    n_rows=st.sampled_from([0, 3, 13]),
    with_iterator=st.booleans(),
    case=st.sampled_from(CASES),
    data=st.data(),
)
def test_a_rejected_call_changes_nothing(
    workdir: pathlib.Path, per: bool, n_rows: int, with_iterator: bool, case: Case, data: st.DataObject
) -> None:
    per = per or case.per_only
    assume(case.typed is not None or n_rows)  # values bad only against rows need some
    tmp = pathlib.Path(tempfile.mkdtemp(dir=workdir))
    (tmp / "folder").mkdir()
    rb = build(PrioritizedReplayBuffer if per else ReplayBuffer, n_rows, with_iterator, workdir / "storage")
    try:
        kinds = [s for s in (case.typed, case.ranged(rb) if case.ranged and n_rows else None) if s is not None]
        value = data.draw(st.one_of(kinds), label=case.name)
        shown = repr(value)[:200]
        before = exact_state(rb)
        with pytest.raises(errors.ReplayBufferError) as info:
            case.call(rb, value, tmp)
        exc = info.value
        assert type(exc).__module__ == "objectrl_buffer.errors", type(exc)
        assert not isinstance(exc, errors.EmptyBufferError), f"{case.name}({shown}): the argument was not checked"
        message = str(exc)
        names = case.names(value, tmp)
        assert any(word in message for word in names), (case.name, shown, names, message)
        assert_same(exact_state(rb), before, case.name)
        assert sorted(p.name for p in tmp.iterdir() if not p.name.startswith(("corrupt", "folder"))) == []
    finally:
        rb.close()
