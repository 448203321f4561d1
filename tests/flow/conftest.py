"""Fixtures of the rate limiter's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def children() -> Iterator[list[Any]]:
    """Forked processes started by a test: whatever is left alive at its end is killed."""
    started: list[Any] = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(5)
