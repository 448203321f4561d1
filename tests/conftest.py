"""Fixtures shared by the test suite; the helpers they use live in ``tests/support.py``."""

from __future__ import annotations

import logging
import os

# tests/test_main_job.py re-runs the main job and compares it bit for bit with a record computed under
# MKL_CBWR=COMPATIBLE (examples/dqn_cartpole.py sets it when run as a script). MKL reads it once, at its first
# call, so it is set here, before any test multiplies a matrix.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from tests.support import (
    fill,
)

# torchrl logs one INFO line per storage allocation; thousands of resets would flood failure reports.
logging.getLogger("torchrl").setLevel(logging.WARNING)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` cases run only with ``RUN_SLOW=1`` (``make test-all``), so that ``make test``
    stays under 8 minutes on 2 cores even when a slow case forgets its own ``skipif``."""
    if os.environ.get("RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="a slow case: set RUN_SLOW=1 (make test-all)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
