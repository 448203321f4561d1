"""Argument checks shared by every buffer: each raises :class:`InvalidArgumentError` naming the argument."""

from __future__ import annotations

import math
from typing import Any

from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["positive_int", "real_in"]

#: The largest size any buffer accepts: slots are int64 tensors, and every byte count must fit one too.
MAX_SIZE = 2**62


def positive_int(value: Any, name: str, *, limit: int = MAX_SIZE) -> int:
    """``value`` as an ``int`` in ``[1, limit]``; ``bool`` and non-integers (``2.0``, ``"3"``) are refused.

    Raises:
        InvalidArgumentError: naming ``name`` and the value.
    """
    if isinstance(value, bool):  # bool has __index__, but True as a size is a bug in the caller
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(value, int):
        try:
            value = int(value.__index__())
        except (AttributeError, TypeError):
            raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}") from None
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value}")
    if value > limit:
        raise InvalidArgumentError(f"{name} must be at most {limit}, got {value}")
    return value


def real_in(value: Any, name: str, low: float, high: float, *, finite: bool = False) -> float:
    """``value`` as a ``float`` in ``[low, high]`` (a real number, not a ``bool``; finite if asked).

    Raises:
        InvalidArgumentError: naming ``name``, the range and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if finite and not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be finite, got {value!r}")
    return float(value)
