"""The write rule: which values may go into a column of another dtype or per-row shape, losing nothing.

The same for tensors, NumPy arrays/scalars, lists and Python numbers; upstream's torchrl storage casts
silently, but nothing may be lost here:

* dtype: accepted when ``torch.can_cast(source, stored)`` (same kind or wider: never float -> int, not
  even 1.0, never anything but bool -> bool, never complex -> real) and, from an integer or bool
  source, every value survives the cast exactly: into an integer column it must lie in the column's
  range (int64 -> int32 only within int32's, -1 never into uint8), into a float column it must come
  back equal and finite (int64 -> float32: all of ``|v| <= 2**24``, beyond that only exact values such
  as ``2**40``). A float into a narrower float rounds to nearest, as NumPy and torch do, but a finite
  value beyond the column's range (``2**200`` into float32), which would become +-inf, is refused;
  inf and nan stay inf and nan.
* shape: the per-row shape may differ from the stored one only by dimensions of size 1 (stored ``()``
  takes ``[1]``, ``[1]`` takes ``()``, ``[3]`` takes ``[1, 3]``; ``[2, 3]`` never takes ``[3, 2]``).
  ``add_batch`` applies it to the shape after the leading batch dimension.
* A tensor that needs a cast or reshape warns once per key per buffer (:class:`CastWarning`). NumPy
  values and Python numbers never carry the column's exact type (float64 observations into float32),
  so they are cast or reshaped without a warning. Tensors on the meta device (no data) are refused.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "SAME",
    "UNCHECKED",
    "CHECK_VALUES",
    "REFUSED",
    "cast_rule",
    "exact_ints",
    "int_fits",
    "first_inexact",
    "narrows",
    "first_overflow",
    "same_meaning",
    "real_part",
]

#: What :func:`cast_rule` says of a (source, stored) dtype pair.
SAME, UNCHECKED, CHECK_VALUES, REFUSED = 0, 1, 2, 3


def real_part(dtype: torch.dtype) -> torch.dtype:
    """The dtype of one component: float32 for complex64, the dtype itself otherwise."""
    return dtype.to_real() if dtype.is_complex else dtype


def exact_ints(dtype: torch.dtype) -> tuple[int, int]:
    """``(low, high)``: every integer in this range is held exactly by ``dtype`` (a column of numbers)."""
    if dtype.is_floating_point or dtype.is_complex:
        bits = 1 - round(math.log2(torch.finfo(real_part(dtype)).eps))  # significand bits, implicit one included
        return -(2**bits), 2**bits
    if dtype == torch.bool:
        return 0, 1
    info = torch.iinfo(dtype)
    return int(info.min), int(info.max)


def cast_rule(source: torch.dtype, stored: torch.dtype) -> int:
    """How values of dtype ``source`` may go into a column of dtype ``stored`` (see the module docstring).

    ``SAME``; ``UNCHECKED`` (every value casts: a wider type, or float rounding); ``CHECK_VALUES`` (an
    integer source whose values must each come back exactly); ``REFUSED`` (float -> int, non-bool ->
    bool, complex -> real).
    """
    if source == stored:
        return SAME
    if not torch.can_cast(source, stored):
        return REFUSED
    if source.is_floating_point or source.is_complex or source == torch.bool:
        return UNCHECKED
    low, high = exact_ints(stored)
    info = torch.iinfo(source)
    return UNCHECKED if low <= info.min and info.max <= high else CHECK_VALUES


def int_fits(value: int, dtype: torch.dtype) -> bool:
    """Whether a Python int is held exactly by a column of ``dtype`` (not bool: an int is no bool)."""
    low, high = exact_ints(dtype)
    if low <= value <= high:
        return True
    if not (dtype.is_floating_point or dtype.is_complex):
        return False
    try:  # beyond the contiguous range some ints (2**40 in float32) are still exact
        cast = torch.tensor(float(value), dtype=torch.float64).to(real_part(dtype)).item()
    except OverflowError:  # beyond float64 (10**400)
        return False
    return math.isfinite(cast) and int(cast) == value


def first_inexact(value: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor | None, Any]:
    """``value`` cast to ``dtype``, or ``None`` and the first element that does not come back exactly."""
    cast = value.to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        back = cast.real if cast.is_complex() else cast
        # not finite: int64 -> float16 -> int64 can land back on int64's minimum
        bad = (back.to(value.dtype) != value) | ~torch.isfinite(back)
    else:  # a range check: a round trip misses wraparound both ways (int8 -1 -> uint8 255 -> int8 -1)
        low, high = exact_ints(dtype)
        wide = value.to(torch.int64)
        bad = (wide < low) | (wide > high)
    if bool(bad.any()):
        return None, value[bad].flatten()[0].item()
    return cast, None


def narrows(source: torch.dtype, stored: torch.dtype) -> bool:
    """Whether a finite float or complex value of ``source`` can overflow (to +-inf) in a ``stored`` column."""
    if not (source.is_floating_point or source.is_complex) or not (stored.is_floating_point or stored.is_complex):
        return False
    return torch.finfo(real_part(stored)).max < torch.finfo(real_part(source)).max


def first_overflow(value: torch.Tensor, cast: torch.Tensor) -> Any:
    """The first finite element of ``value`` whose ``cast`` is not finite (it overflowed), or ``None``."""
    bad = torch.isfinite(value) & ~torch.isfinite(cast)
    if bool(bad.any()):
        return value[bad].flatten()[0].item()
    return None


def same_meaning(shape: torch.Size, stored: torch.Size) -> bool:
    """Whether a per-row ``shape`` differs from the ``stored`` one only by dimensions of size 1."""
    return [d for d in shape if d != 1] == [d for d in stored if d != 1]
