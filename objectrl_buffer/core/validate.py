"""Argument checks shared by every buffer: each raises :class:`InvalidArgumentError` naming the argument."""

from __future__ import annotations

import math
from typing import Any

from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["positive_int", "integer", "real_in", "env_multiple"]

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


def integer(value: Any, name: str) -> int:
    """``value`` as an ``int`` (anything with ``__index__`` but ``bool``), any sign.

    Raises:
        InvalidArgumentError: naming ``name`` and the value.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    return int(value.__index__())


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


def env_multiple(buffer_size: int, num_envs: int) -> int:
    """``buffer_size`` if whole env steps (``num_envs`` rows each) fill it.

    Raises:
        InvalidArgumentError: naming both.
    """
    if buffer_size % num_envs:
        raise InvalidArgumentError(
            f"buffer_size {buffer_size} is not a multiple of num_envs {num_envs}: every env step takes num_envs slots"
        )
    return buffer_size
