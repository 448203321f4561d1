"""Issue 26: a finite float that a narrower float column cannot hold (``2**200`` into float32) is refused.

It used to be stored as ``inf``. Every write path refuses it with a ``SchemaError`` naming the key and leaves
the buffer as it was; inf and nan given as inf and nan still fit.
"""

from __future__ import annotations

import multiprocessing as mp
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.process import is_shared
from objectrl_buffer.errors import SchemaError
from tests.support import assert_unchanged, snapshot

HUGE = 2.0**200


def _buffer(column: torch.dtype, *, fast: bool, num_envs: int = 1) -> ReplayBuffer:
    """A buffer of ``state`` ([3] of ``column``) and ``reward`` (() of ``column``), one row (per env) stored."""
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0, num_envs=num_envs)
    shape = (num_envs,) if num_envs > 1 else ()
    rb.add({"state": torch.zeros((*shape, 3), dtype=column), "reward": torch.zeros(shape, dtype=column)})
    if not fast:
        rb.engine.storage.fast = None  # the checked path only
    return rb


# (what a row holds, the key refused); float64 values as a MuJoCo env hands them over
ROWS: dict[str, tuple[dict[str, Any], str]] = {
    "numpy float64 array": ({"state": np.array([1.0, HUGE, 0.0]), "reward": 0.0}, "state"),
    "numpy float64 array, -huge": ({"state": np.array([1.0, -HUGE, 0.0]), "reward": 0.0}, "state"),
    "numpy float64 array with nan": ({"state": np.array([np.nan, HUGE, 0.0]), "reward": 0.0}, "state"),
    "float64 tensor": ({"state": torch.tensor([0.0, 0.0, HUGE], dtype=torch.float64), "reward": 0.0}, "state"),
    "list of Python floats": ({"state": [HUGE, 0.0, 0.0], "reward": 0.0}, "state"),
    "Python float": ({"state": np.zeros(3), "reward": HUGE}, "reward"),
    "numpy float64 scalar": ({"state": np.zeros(3), "reward": np.float64(-HUGE)}, "reward"),
    "0-d float64 array": ({"state": np.zeros(3), "reward": np.array(HUGE)}, "reward"),
}


def _add(rb: ReplayBuffer, row: dict[str, Any], form: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CastWarning for tensors; NumPy's overflow warning on the old code
        if form == "dict":
            rb.add(row)
        elif form == "tensordict":
            rb.add(TensorDict({k: torch.as_tensor(np.asarray(v)) for k, v in row.items()}, batch_size=[]))
        else:  # add_batch of two rows, the second one fine
            rb.add_batch(
                {
                    k: np.stack([np.asarray(v, dtype=np.float64), np.zeros_like(v, dtype=np.float64)])
                    for k, v in row.items()
                }
            )


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
@pytest.mark.parametrize("column", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ROWS, ids=str)
def test_finite_value_beyond_the_column_is_refused(case: str, column: torch.dtype, fast: bool) -> None:
    row, key = ROWS[case]
    rb = _buffer(column, fast=fast)
    before = snapshot(rb)
    forms = ["dict", "add_batch"] + (["tensordict"] if case != "list of Python floats" else [])
    for form in forms:
        with pytest.raises(SchemaError, match=f"key '{key}'"):
            _add(rb, row, form)
        assert_unchanged(rb, before)
    rb.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_float32_beyond_float16_is_refused(fast: bool) -> None:
    rb = _buffer(torch.float16, fast=fast)
    before = snapshot(rb)
    for bad in (
        {"state": np.array([7e4, 0, 0], dtype=np.float32), "reward": 0.0},
        {"state": np.zeros(3), "reward": 1e5},
    ):
        with pytest.raises(SchemaError, match=r"key '(state|reward)'.*float16"):
            rb.add(bad)
        assert_unchanged(rb, before)
    rb.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
@pytest.mark.parametrize("column", [torch.float32, torch.float16], ids=str)
def test_inf_and_nan_still_fit_and_values_in_range_round(column: torch.dtype, fast: bool) -> None:
    rb = _buffer(column, fast=fast)
    limit = torch.finfo(column).max
    rb.add({"state": np.array([np.inf, -np.inf, np.nan]), "reward": float("nan")})
    rb.add({"state": np.array([limit, -limit, 0.1]), "reward": np.float64(-np.inf)})
    rb.add_batch({"state": np.array([[np.nan, np.inf, 1.0]]), "reward": np.array([np.inf])})
    got = rb.sample_by_index([1, 2, 3])
    assert got["state"].dtype == column
    assert torch.equal(got["state"][0, :2], torch.tensor([np.inf, -np.inf], dtype=column))
    assert bool(got["state"][0, 2].isnan()) and bool(got["reward"][0].isnan())
    assert torch.equal(got["state"][1], torch.tensor([limit, -limit, 0.1], dtype=column))
    assert got["reward"][1].item() == -np.inf and got["reward"][2].item() == np.inf
    rb.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_vector_env_step_beyond_the_column_is_refused(fast: bool) -> None:
    rb = _buffer(torch.float32, fast=fast, num_envs=2)
    before = snapshot(rb)
    step = {"state": np.array([[0.0, 0.0, 0.0], [0.0, HUGE, 0.0]]), "reward": np.array([0.0, 1.0])}
    with pytest.raises(SchemaError, match="key 'state'"):
        rb.add(step)
    assert_unchanged(rb, before)
    with pytest.raises(SchemaError, match="key 'reward'"):
        rb.add({"state": np.zeros((2, 3)), "reward": np.array([HUGE, 0.0])})
    assert_unchanged(rb, before)
    rb.close()


def test_first_write_of_a_python_float_beyond_float32_is_refused() -> None:
    rb = ReplayBuffer("cpu", "cpu", 4, seed=0)
    with pytest.raises(SchemaError, match="key 'reward'"):
        rb.add({"state": np.zeros(3), "reward": HUGE})  # a Python float is stored as float32
    assert len(rb) == 0 and rb.schema is None
    rb.close()


def test_shared_buffer_refuses_it_too() -> None:
    rb = _buffer(torch.float32, fast=True)
    queue = mp.get_context("fork").SimpleQueue()  # through multiprocessing's pickler: the buffer is shared now
    queue.put(rb)
    queue.get().close()
    assert is_shared(rb)
    before = snapshot(rb)
    for row, key in ROWS.values():
        with pytest.raises(SchemaError, match=f"key '{key}'"):
            _add(rb, row, "dict")
        with pytest.raises(SchemaError, match=f"key '{key}'"):
            _add(rb, row, "add_batch")
    assert_unchanged(rb, before)
    rb.close()
