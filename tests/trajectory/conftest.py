"""Fixtures of the trajectory tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from objectrl_buffer.trajectory import TrajectoryReplayBuffer


@pytest.fixture
def make() -> Iterator[Callable[..., TrajectoryReplayBuffer]]:
    """Factory of TrajectoryReplayBuffers, each closed after the test."""
    made: list[TrajectoryReplayBuffer] = []

    def build(*args: Any, **kwargs: Any) -> TrajectoryReplayBuffer:
        buffer = TrajectoryReplayBuffer(*args, **kwargs)
        made.append(buffer)
        return buffer

    yield build
    for buffer in made:
        buffer.close()
