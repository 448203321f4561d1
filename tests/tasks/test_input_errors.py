"""Bad rows and paths given to a task buffer raise a class from objectrl_buffer.errors naming the field or
argument (never a raw builtin), and leave the storage exactly as it was: a batch with one bad row stores
nothing. Type errors are ``InvalidTypeError``: an ``InvalidArgumentError`` that ``except TypeError`` (what
earlier releases raised) still catches. A 0-d real tensor ``step``/``execute_time`` is taken as its number."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from objectrl_buffer.errors import InvalidArgumentError, InvalidTypeError
from objectrl_buffer.tasks import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    SharedTaskStorage,
    TaskReplayBuffer,
    TensorDictConverter,
)
from objectrl_buffer.tasks.rows import META_STRINGS
from tests.tasks.workers import step_row


def row(
    task_id: Any = "new", step: Any = 0, when: Any = 0.0, name: Any = "n", row_id: Any = None, **data: Any
) -> DataRow:
    built = DataRow(ExpMeta(task_id, name, "a", step, when), Experience(**data))
    if row_id is not None:
        built.id = row_id
    return built


def nest(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture(params=["memory", "shared"])
def buffer(request: pytest.FixtureRequest, tmp_path: Path) -> TaskReplayBuffer:
    storage = InMemoryStorage(max_capacity=50) if request.param == "memory" else SharedTaskStorage(50, tmp_path / "s")
    rb = TaskReplayBuffer(storage, seed=0)
    rb.store_batch([step_row(0, t, s) for t in range(2) for s in range(3)])
    return rb


def snapshot(rb: TaskReplayBuffer) -> Any:
    """Everything a store could change: rows (all fields), counts, FIFO order, vocabularies, shared files."""
    storage = rb.storage
    table = storage.get_table()  # type: ignore[attr-defined]
    files = {}
    if isinstance(storage, SharedTaskStorage):
        files = {n: os.path.getsize(os.path.join(storage.path, n)) for n in ("rows.data", "rows.index")}
    return (
        [r.to_dict() for r in storage.get_all()],
        len(rb),
        storage.matching_task_ids(),  # type: ignore[attr-defined]
        {n: list(table.vocabs[n].strings) for n in META_STRINGS},
        files,
    )


# (what the bad row is, the field its message must name); every one a wrong type: InvalidTypeError
BAD_FIELDS: dict[str, tuple[Callable[[], Any], str]] = {
    "task_id=5": (lambda: row(task_id=5), r"exp_meta\.task_id"),
    "task_name=3": (lambda: row(name=3), r"exp_meta\.task_name"),
    "step=True": (lambda: row(step=True), r"exp_meta\.step"),
    "step='0'": (lambda: row(step="0"), r"exp_meta\.step"),
    "step=tensor([5])": (lambda: row(step=torch.tensor([5])), r"exp_meta\.step"),
    "step=tensor(True)": (lambda: row(step=torch.tensor(True)), r"exp_meta\.step"),
    "step=tensor(1+2j)": (lambda: row(step=torch.tensor(1 + 2j)), r"exp_meta\.step"),
    "step=np.bool_": (lambda: row(step=np.bool_(True)), r"exp_meta\.step"),
    "execute_time='x'": (lambda: row(when="x"), r"exp_meta\.execute_time"),
    "reward_t=1+2j": (lambda: row(reward_t=1 + 2j), r"exp_data\.reward_t"),
    "state 3000 deep": (lambda: row(state=nest(3000)), r"exp_data\.state.*nested more than"),
    "state={'d': 3000 deep}": (lambda: row(state={"d": nest(3000)}), r"exp_data\.state\.d.*nested more than"),
    "state=object()": (lambda: row(state=object()), r"exp_data\.state.*object"),
    "actions=[object()]": (lambda: row(actions=[1, object()]), r"exp_data\.actions\[1\]"),
    "messages tuple key": (lambda: row(messages={(1, 2): "x"}), r"exp_data\.messages.*dict key"),
    "id=7": (lambda: row(row_id=7), r"DataRow\.id"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
@pytest.mark.parametrize("call", ["store", "store_batch"])
def test_a_field_of_the_wrong_type_is_named_and_stores_nothing(buffer: TaskReplayBuffer, call: str, case: str) -> None:
    make, named = BAD_FIELDS[case]
    before = snapshot(buffer)
    with pytest.raises(InvalidArgumentError, match=named) as info:
        if call == "store":
            buffer.store(make())
        else:
            buffer.store_batch([row("good"), row("new", step=1), make()])  # all or nothing
    assert isinstance(info.value, InvalidTypeError) and isinstance(info.value, TypeError)  # earlier releases
    assert snapshot(buffer) == before


@pytest.mark.parametrize(
    ("value", "stored"),
    [(torch.tensor(5), 5), (torch.tensor(5, dtype=torch.int16), 5), (torch.tensor(7.0), 7.0), (np.int64(5), 5)],
    ids=["tensor(5)", "int16 tensor", "tensor(7.)", "np.int64"],
)
def test_a_0d_real_tensor_step_is_its_number(buffer: TaskReplayBuffer, value: Any, stored: Any) -> None:
    buffer.store(row("scalar", step=value, when=torch.tensor(1.5, dtype=torch.float64)))
    [got] = buffer.storage.get_by_task_id("scalar")
    assert type(got.exp_meta.step) is type(stored) and got.exp_meta.step == stored
    assert type(got.exp_meta.execute_time) is float and got.exp_meta.execute_time == 1.5
    [td] = buffer.sample_task(
        query_condition={"field": "task_id", "op": "eq", "value": "scalar"}, converter=TensorDictConverter()
    )
    assert td["step"].tolist() == [int(stored)]


class Phase(enum.IntEnum):
    ACT = 3


def test_other_real_steps_are_stored_as_plain_numbers_that_save(buffer: TaskReplayBuffer, tmp_path: Path) -> None:
    buffer.store_batch([row("enum", step=Phase.ACT), row("fraction", step=Fraction(1, 2), when=Fraction(3, 4))])
    got = {r.exp_meta.task_id: r.exp_meta for r in buffer.storage.get_all()}  # shared: raw TypeError before
    assert type(got["enum"].step) is int and got["enum"].step == 3
    assert (type(got["fraction"].step), got["fraction"].step, got["fraction"].execute_time) == (float, 0.5, 0.75)
    buffer.save(tmp_path / "ckpt")  # in memory: raw TypeError (JSON of a Fraction) before
    other = TaskReplayBuffer(InMemoryStorage(max_capacity=50))
    other.load(tmp_path / "ckpt")
    assert [r.to_dict() for r in other.storage.get_all()] == snapshot(buffer)[0]
    before = snapshot(buffer)
    with pytest.raises(InvalidArgumentError, match=r"exp_meta\.step must fit a float64"):
        buffer.store(row("huge", step=Fraction(10**400, 3)))
    assert snapshot(buffer) == before


def test_experience_with_action_and_actions_names_both() -> None:
    with pytest.raises(InvalidTypeError, match=r"actions= or action="):
        Experience(actions=[1], action=2)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda rb: rb.store(None), "Data is required"),
        (lambda rb: rb.store_batch([]), "data_batch is empty"),
        (lambda rb: rb.store_batch([row("good"), None]), "Data is required"),
        (lambda rb: rb.store_batch([row("good"), "not a row"]), "exp_meta is required"),
        (lambda rb: rb.store_batch(row("one")), "data_batch must be a list"),
        (lambda rb: rb.storage.add_batch(5), "data_batch must be a list"),
    ],
    ids=["store(None)", "store_batch([])", "None in a batch", "str in a batch", "store_batch(row)", "add_batch(5)"],
)
def test_missing_rows_raise_invalid_argument(buffer: TaskReplayBuffer, call: Callable[[Any], Any], named: str) -> None:
    before = snapshot(buffer)
    with pytest.raises(InvalidArgumentError, match=named):  # ValueError (AWorld's messages) or raw TypeError before
        call(buffer)
    assert snapshot(buffer) == before


# ---------------------------------------------------------------- save/load paths


@pytest.mark.parametrize("value", [None, "", b"ckpt", 5], ids=["None", "empty", "bytes", "int"])
@pytest.mark.parametrize("call", ["save", "load"])
def test_a_path_that_is_not_one_is_refused(
    buffer: TaskReplayBuffer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, value: Any
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # save("") or save(b"ckpt") must not write into the current folder
    before = snapshot(buffer)
    with pytest.raises(InvalidArgumentError, match=r"^path "):
        getattr(buffer, call)(value)
    assert snapshot(buffer) == before
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("call", ["save", "load"])
def test_a_file_where_the_checkpoint_folder_goes_is_refused(
    buffer: TaskReplayBuffer, tmp_path: Path, call: str
) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"mine")
    before = snapshot(buffer)
    for target in (blocker, blocker / "ckpt"):
        with pytest.raises(InvalidArgumentError, match=r"^path .*is a file"):  # CheckpointError before
            getattr(buffer, call)(target)
    assert snapshot(buffer) == before
    assert blocker.read_bytes() == b"mine"


def test_a_folder_path_with_a_trailing_separator_saves_and_loads(buffer: TaskReplayBuffer, tmp_path: Path) -> None:
    buffer.save(f"{tmp_path / 'ckpt'}{os.sep}")  # a checkpoint is a folder: validate.path's file rule does not apply
    other = TaskReplayBuffer(InMemoryStorage(max_capacity=50))
    other.load(f"{tmp_path / 'ckpt'}{os.sep}")
    assert [r.to_dict() for r in other.storage.get_all()] == snapshot(buffer)[0]


# ---------------------------------------------------------------- the other arguments of the room


@pytest.mark.parametrize("seed", ["x", True, 1.5, 2**64], ids=repr)
def test_a_seed_that_is_not_an_int_is_refused(seed: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^seed "):  # raw ValueError, or taken as int(seed), before
        TaskReplayBuffer(InMemoryStorage(), seed=seed)


@pytest.mark.parametrize(
    ("page", "page_size", "named"),
    [(0, 1, "page=0"), (True, 1, "page=True"), (1, "2", "page_size='2'"), (1, -1, "page_size=-1")],
    ids=repr,
)
def test_a_page_that_is_not_a_positive_int_is_refused(
    buffer: TaskReplayBuffer, page: Any, page_size: Any, named: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=named):  # a plain ValueError (AWorld's message) before
        buffer.storage.get_paginated(page, page_size)
