"""Helpers of the rate limiter's fork tests: rows, counters read together, waiting (the ``children`` fixture of
forked processes is in ``conftest.py``)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import torch

from objectrl_buffer.errors import RateLimitTimeout
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


def check_two_writers_of_ratio_1_20_10(rb: Any, limiter: RateLimiter, children: list[Any], out: Any) -> None:
    """Two started fork writers of 20 rows each into ``rb`` (one row already in it) under
    ``SampleToInsertRatio(1, 20, 10)``: with no sample Reverb admits exactly 30 inserts; the parent's samples
    then unblock the rest, ``inserts - samples`` staying within [10, 30], and every row lands (41)."""
    allowed = 20 + 10  # what Reverb's CanInsert admits with no sample
    assert wait_until(lambda: counts(limiter)[0] >= allowed, 3.0), f"the parent sees {counts(limiter)}"
    time.sleep(0.2)  # the writers keep trying: nothing more is admitted without a sample
    assert counts(limiter) == (allowed, 0, 0) and len(rb) == allowed
    diffs = []
    deadline = time.monotonic() + 10
    while any(p.is_alive() for p in children) and time.monotonic() < deadline:
        with contextlib.suppress(RateLimitTimeout):
            rb.sample_batch(2, timeout=0.05)  # the parent's samples unblock the children
        inserts, samples, _ = counts(limiter)
        diffs.append(inserts - samples)
    results = [out.get() for _ in children]
    assert results == [(20, None), (20, None)]
    for p in children:
        p.join(5)
        assert p.exitcode == 0
    assert counts(limiter)[0] == len(rb) == 41
    assert all(10 <= d <= 30 for d in diffs), diffs


def writer(rb: Any, first: int, n: int, out: Any) -> None:
    """In a child: ``n`` rows through ``rb.add(..., timeout=5)``; reports ``(rows written, first error or
    None)`` on ``out``."""
    done, error = 0, None
    try:
        for i in range(first, first + n):
            rb.add(row(i), timeout=5)
            done += 1
    except Exception as exc:  # reported to the parent, which asserts there was none
        error = f"{type(exc).__name__}: {exc}"
    out.put((done, error))
