"""Helpers of the async buffer tests: bounded event-loop runs, samples, state snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import torch

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, Consumer

T = TypeVar("T")

#: Every test run of a coroutine is bounded: a hang fails the test instead of stalling the suite.
TIMEOUT = 10.0


def run(coro: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def bounded(coro: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
    return await asyncio.wait_for(coro, timeout)


def seq(sample_id: int, length: int | None = None) -> dict[str, Any]:
    """A sample: ``ids`` and ``tokens`` of ``length`` (default ``sample_id % 7 + 1``) derived from the id."""
    n = sample_id % 7 + 1 if length is None else length
    return {"ids": sample_id, "tokens": torch.arange(n, dtype=torch.int64) + 1000 * sample_id}


def reward(sample_id: int) -> dict[str, Any]:
    return {"ids": sample_id, "rewards": torch.tensor(float(sample_id))}


def two_consumers(n_train: int = 2, n_ref: int = 2) -> list[Consumer]:
    return [Consumer("actor_train", ("tokens", "rewards"), n_train), Consumer("ref_logp", ("tokens",), n_ref)]


def make(max_size: int = 8, **kwargs: Any) -> AsyncSequenceBuffer:
    return AsyncSequenceBuffer(kwargs.pop("consumers", None) or two_consumers(), max_size, **kwargs)


def snapshot(buf: AsyncSequenceBuffer) -> dict[str, Any]:
    """Everything a user could observe, to compare before/after a refused call."""
    return {
        "size": buf.size,
        "consumed": buf.consumed_ids(),
        "state": {k: v.clone() for k, v in buf.state_dict()["tensors"].items()},
        "header": buf.state_dict()["header"],
    }


def assert_unchanged(buf: AsyncSequenceBuffer, before: dict[str, Any]) -> None:
    after = snapshot(buf)
    assert after["size"] == before["size"]
    assert after["consumed"] == before["consumed"]
    assert after["header"] == before["header"]
    assert after["state"].keys() == before["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), key
    buf.check_invariants()
