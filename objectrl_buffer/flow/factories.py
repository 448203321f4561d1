"""Reverb's rate limiter factories: ``SampleToInsertRatio``, ``MinSize`` and ``Queue``.

Each one checks its own arguments and turns them into the ``(samples_per_insert, min_size_to_sample,
min_diff, max_diff)`` of a :class:`~objectrl_buffer.flow.limiter.RateLimiter` (see there for the rules).
"""

from __future__ import annotations

import math
import warnings

from objectrl_buffer.core.validate import positive_int, real_in
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow.limiter import BIG, RateLimiter

__all__ = ["SampleToInsertRatio", "MinSize", "Queue"]


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample`` rows are held.

    ``error_buffer``: a number ``e`` gives ``min_diff, max_diff = min_size_to_sample * spi -+ e`` (the offset
    makes the ratio count only what happens after the fill-up); a ``(min_diff, max_diff)`` pair is used as is.

    Raises:
        InvalidArgumentError: ``max_diff - min_diff < 2 * max(1, spi)`` (it could block every call),
            ``min_diff > min_size_to_sample * spi`` (a deadlock once the buffer is filled up), or as
            :class:`RateLimiter`.

    Warns:
        RuntimeWarning: ``max_diff < min_size_to_sample * spi``: inserts block once the buffer is filled up
            unless a sampler runs at the same time.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | tuple[float, float],
        *,
        deadlock_after_s: float | None = 1.0,
    ) -> None:
        spi = real_in(samples_per_insert, "samples_per_insert", 0.0, math.inf, finite=True)
        size = positive_int(min_size_to_sample, "min_size_to_sample")
        if isinstance(error_buffer, (int, float)) and not isinstance(error_buffer, bool):
            e = real_in(error_buffer, "error_buffer", 0.0, math.inf)
            min_diff, max_diff = size * spi - e, size * spi + e
        elif isinstance(error_buffer, tuple) and len(error_buffer) == 2:
            min_diff = real_in(error_buffer[0], "error_buffer[0]", -math.inf, math.inf)
            max_diff = real_in(error_buffer[1], "error_buffer[1]", -math.inf, math.inf)
        else:
            raise InvalidArgumentError(
                f"error_buffer must be a number or a (min_diff, max_diff) pair, got {error_buffer!r}"
            )
        if not max_diff - min_diff >= 2 * max(1.0, spi):
            raise InvalidArgumentError(
                f"error_buffer {error_buffer!r} is too small: max_diff - min_diff must be >= "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, spi):g}, as a smaller range could block "
                "every sample and/or insert"
            )
        if max_diff < spi * size:
            warnings.warn(
                f"error_buffer {error_buffer!r}: max_diff {max_diff:g} is below min_size_to_sample * "
                f"samples_per_insert = {spi * size:g}: inserts block once min_size_to_sample rows are held "
                "unless a sampler runs concurrently",
                RuntimeWarning,
                stacklevel=2,
            )
        if min_diff > spi * size:
            raise InvalidArgumentError(
                f"error_buffer {error_buffer!r}: min_diff {min_diff:g} is above min_size_to_sample * "
                f"samples_per_insert = {spi * size:g}: sampling would deadlock once min_size_to_sample rows are held"
            )
        super().__init__(spi, size, min_diff, max_diff, deadlock_after_s=deadlock_after_s)


class MinSize(RateLimiter):
    """Block samples until ``min_size_to_sample`` rows are held; never block inserts."""

    def __init__(self, min_size_to_sample: int, *, deadlock_after_s: float | None = 1.0) -> None:
        size = positive_int(min_size_to_sample, "min_size_to_sample")
        super().__init__(1.0, size, -BIG, BIG, deadlock_after_s=deadlock_after_s)


class Queue(RateLimiter):
    """Each row sampled once: at most ``size`` rows inserted and not yet sampled; samples wait for rows."""

    def __init__(self, size: int, *, deadlock_after_s: float | None = 1.0) -> None:
        n = positive_int(size, "size")
        super().__init__(1.0, 1, 0.0, float(n), deadlock_after_s=deadlock_after_s)
