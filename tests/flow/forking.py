"""Helpers of the rate limiter's fork tests: rows, counters read together, waiting (the ``children`` fixture of
forked processes is in ``conftest.py``)."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import torch

from objectrl_buffer.flow import RateLimiter

FORK = mp.get_context("fork")


def row(i: int) -> dict[str, Any]:
    return {"obs": torch.full((3,), float(i)), "step": i}


def counts(limiter: RateLimiter) -> tuple[int, int, int]:
    """The counters, read together under the limiter's lock."""
    _, values = limiter.state()
    return int(values["inserts"]), int(values["samples"]), int(values["deletes"])  # type: ignore[arg-type]


def wait_until(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
