"""Shared fixtures and helpers: transitions built the way ObjectRL builds them, buffers, snapshots."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer import ReplayBuffer

# torchrl logs one INFO line per storage allocation; thousands of resets would flood failure reports.
logging.getLogger("torchrl").setLevel(logging.WARNING)

OBS_DIM = 4
ACT_DIM = 2
#: Keys of a transition as ObjectRL's base agent stores it (PPO adds ``PPO_KEYS``).
OBJECTRL_KEYS = ("state", "action", "reward", "next_state", "terminated", "truncated", "step")
PPO_KEYS = ("action_logprob", "value", "next_state_value")


def objectrl_transition(step: int, storing_device: str | torch.device = "cpu", *, ppo: bool = False) -> TensorDict:
    """One transition exactly as ObjectRL's ``agent.generate_transition`` builds it.

    ``state``/``action``/``next_state`` are tensors moved to the storing device, ``reward``/``terminated``/
    ``truncated`` are Python floats, ``step`` a Python int (TensorDict turns them into 0-d tensors).
    Every value is a function of ``step``, so a stored row can be identified by its ``step``.
    """
    state = torch.arange(OBS_DIM, dtype=torch.float32) + step
    data: dict[str, Any] = {
        "state": state.to(storing_device),
        "action": torch.full((ACT_DIM,), step / 10).to(storing_device),
        "reward": float(step) * 0.5,
        "next_state": (state + 1).to(storing_device),
        "terminated": float(step % 7 == 6),
        "truncated": float(False),
        "step": int(step),
    }
    if ppo:
        data["action_logprob"] = torch.tensor(-0.01 * step)
        data["value"] = torch.tensor(0.25 * step)
        data["next_state_value"] = torch.tensor(0.25 * (step + 1))
    return TensorDict(data, batch_size=[])


def objectrl_batch(start: int, n: int, *, ppo: bool = False) -> TensorDict:
    """``n`` transitions with steps ``start .. start+n-1`` as one TensorDict of batch size ``[n]``."""
    rows = [objectrl_transition(start + i, ppo=ppo) for i in range(n)]
    if not rows:
        template = objectrl_transition(0, ppo=ppo)
        return TensorDict({k: v.new_empty((0, *v.shape)) for k, v in template.items()}, batch_size=[0])
    keys = list(rows[0].keys())  # not `in rows[0]`: iterating a TensorDict walks its batch dimension
    return TensorDict({k: torch.stack([r[k] for r in rows]) for k in keys}, batch_size=[n])


def fill(rb: ReplayBuffer, steps: range | list[int], *, ppo: bool = False) -> None:
    """``rb.add`` one ObjectRL transition per step."""
    for step in steps:
        rb.add(objectrl_transition(step, ppo=ppo))


def steps_of(td: TensorDictBase) -> list[int]:
    """The ``step`` values of a sample, as a list (identifies the rows)."""
    return td["step"].tolist()


def assert_td_equal(actual: TensorDictBase, expected: TensorDictBase) -> None:
    """Same batch size, same (nested) keys, bit-identical values and dtypes."""
    assert actual.batch_size == expected.batch_size
    actual_keys = set(actual.keys(include_nested=True, leaves_only=True))
    expected_keys = set(expected.keys(include_nested=True, leaves_only=True))
    assert actual_keys == expected_keys
    for key in expected_keys:
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype, key
        assert torch.equal(a, e), key


def snapshot(rb: ReplayBuffer) -> dict[str, Any]:
    """Everything observable about a buffer, to check that a failed call changed nothing."""
    visible = rb.data_size > 0 and rb.schema is not None
    return {
        "len": len(rb),
        "size": rb.size,
        "pointer": rb.pointer,
        "data_size": rb.data_size,
        "buffer_size": rb.buffer_size,
        "schema": rb.schema,
        "generator": rb.generator.get_state(),
        "all": rb.sample_all() if visible else None,
        "slots": rb.sample_by_index(range(rb.data_size)) if visible else None,
    }


def assert_unchanged(rb: ReplayBuffer, before: dict[str, Any]) -> None:
    after = snapshot(rb)
    for name in ("len", "size", "pointer", "data_size", "buffer_size", "schema"):
        assert after[name] == before[name], name
    assert torch.equal(after["generator"], before["generator"])
    for name in ("all", "slots"):
        if before[name] is None:
            assert after[name] is None
        else:
            assert_td_equal(after[name], before[name])


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def make_buffer(tmp_path: Any) -> Iterator[Callable[..., ReplayBuffer]]:
    """Factory of CPU buffers with a fixed seed and their memmaps under ``tmp_path``; closed afterwards."""
    made: list[ReplayBuffer] = []

    def make(buffer_size: int = 10, **kwargs: Any) -> ReplayBuffer:
        kwargs.setdefault("seed", 0)
        kwargs.setdefault("storage_dir", tmp_path / "storage")
        rb = ReplayBuffer("cpu", "cpu", buffer_size, **kwargs)
        made.append(rb)
        return rb

    yield make
    for rb in made:
        rb.close()


@pytest.fixture
def rb(make_buffer: Callable[..., ReplayBuffer]) -> ReplayBuffer:
    """An empty CPU buffer of capacity 10, seed 0."""
    return make_buffer(10)


@pytest.fixture
def wrapped(make_buffer: Callable[..., ReplayBuffer]) -> ReplayBuffer:
    """Capacity 10 after 25 single adds (steps 0..24): pointer 5, slots hold steps 20..24 then 15..19."""
    buffer = make_buffer(10)
    fill(buffer, range(25))
    return buffer
