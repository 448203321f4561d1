"""The seed of a buffer built with ``seed=None``: derived from the global torch seed, never drawn from it.

ObjectRL seeds torch globally (``torch.manual_seed``) and never gives its buffer a seed; upstream samples
from the global generator, so two runs with the same seed sample the same rows. Our buffers own a private
generator, so for ``seed=None`` its seed is a hash of

* ``torch.initial_seed()`` (the value of the last ``torch.manual_seed``, or torch's random start-up
  seed if there was none: then runs differ, as they do upstream), and
* how many buffers were built in this process since that seed was last seen to change (0, 1, 2, ...),
  so two buffers never share a stream.

Reading ``torch.initial_seed()`` does not draw from or change any global RNG (torch, NumPy, ``random``).

In one process, seeding with another value resets the count: ``manual_seed(1)``, build, ``manual_seed(2)``,
build, ``manual_seed(1)``, build gives the first buffer's stream again. ``manual_seed(1)`` twice with the
*same* value and nothing built in between leaves no trace that could tell it from one call, so buffers
built after it continue the count (they differ from the earlier ones, as any two buffers in one process
do); pass ``seed=`` explicitly to reproduce a buffer within one process.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["derived_seed", "splitmix64"]

_MASK = (1 << 64) - 1
_lock = threading.Lock()
_last_initial_seed: int | None = None
_built = 0


def splitmix64(value: int) -> int:
    """One step of SplitMix64 (Steele et al. 2014): a bijective 64-bit mix, so close inputs give unrelated outputs."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def derived_seed() -> int:
    """The seed of the next buffer built with ``seed=None`` (a 63-bit int; thread-safe)."""
    global _last_initial_seed, _built
    initial = torch.initial_seed() & _MASK
    with _lock:
        if initial != _last_initial_seed:
            _last_initial_seed, _built = initial, 0
        count = _built
        _built += 1
    # two rounds: the count moves the input of the second, so streams of one global seed are unrelated
    return splitmix64(splitmix64(initial) ^ count) >> 1
