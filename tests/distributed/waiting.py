"""Polling helpers of the distributed tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``check`` until it is truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.02)
