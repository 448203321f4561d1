"""Argument checks shared by every buffer: each raises :class:`InvalidArgumentError` naming the argument."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import InvalidArgumentError, SlotIndexError

__all__ = [
    "slot_indices",
    "last_per_slot",
    "positive_int",
    "integer",
    "real_in",
    "env_multiple",
    "seed",
    "device",
    "buffer_devices",
    "path",
    "folder",
]

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
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    try:
        return int(value.__index__())
    except (AttributeError, TypeError):  # no __index__, or one that refuses (a tensor of several values)
        raise InvalidArgumentError(f"{name} must be an int, got {_brief(value)}") from None


def seed(value: Any, name: str = "seed") -> int:
    """``value`` as an ``int`` a ``torch.Generator`` takes: ``[-2**63, 2**64)``.

    Raises:
        InvalidArgumentError: naming ``name`` and the value.
    """
    value = integer(value, name)
    if not -(2**63) <= value < 2**64:
        raise InvalidArgumentError(f"{name} must be an int in [-2**63, 2**64), got {_brief(value)}")
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


def _brief(value: Any) -> str:
    """``repr(value)``, short enough for one line of an error message."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<an int of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


#: What a device string was probably meant to be, for names torch does not know.
_DEVICE_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "cuda0": "cuda:0", "gpu0": "cuda:0", "cpu0": "cpu"}


def _device_hint(text: str) -> str:
    lowered = text.strip().lower()
    for wrong, right in _DEVICE_ALIASES.items():
        if lowered == wrong or lowered.startswith(wrong + ":"):
            return f" (did you mean '{right}{lowered[len(wrong) :]}'?)"
    try:
        torch.device(lowered)
    except RuntimeError:
        return ""
    return f" (did you mean '{lowered}'?)"


def device(value: Any, name: str, *, hint: str = "") -> torch.device:
    """``value`` (a ``torch.device`` or a device string) as a ``torch.device`` this machine can hold
    tensors on. ``int`` s are refused: ``torch.device(0)`` is ``cuda:0``, never what a size in the
    wrong place meant. ``hint`` ends the message of a value of the wrong type.

    Raises:
        InvalidArgumentError: naming ``name``, the value and, where one is likely, what was meant:
            an unknown string (``"gpu"`` -> ``"cuda"``), ``"meta"`` (holds no data), a CUDA device on
            a machine without CUDA or one past the last, another backend that is not available.
    """
    if isinstance(value, torch.device):
        dev = value
    elif isinstance(value, str):
        try:
            dev = torch.device(value)
        except RuntimeError:
            raise InvalidArgumentError(
                f"{name} must be a torch.device or a string like 'cpu' or 'cuda', got {value!r}{_device_hint(value)}"
            ) from None
    else:
        raise InvalidArgumentError(
            f"{name} must be a torch.device or a string like 'cpu' or 'cuda', got {_brief(value)}{hint}"
        )
    where = f"{name} {str(dev)!r}"
    if dev.type == "meta":
        raise InvalidArgumentError(f"{where}: 'meta' holds no data, a buffer cannot store or deliver rows there")
    if dev.type == "cuda":
        # is_available()/device_count() ask the driver without creating a CUDA context
        if not torch.cuda.is_available():
            raise InvalidArgumentError(
                f"{where}: CUDA is not available here (torch.cuda.is_available() is False); use 'cpu'"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise InvalidArgumentError(
                f"{where}: this machine has {count} CUDA device(s), 'cuda:0' .. 'cuda:{count - 1}'"
            )
    elif dev.type != "cpu":
        is_available = getattr(getattr(torch, dev.type, None), "is_available", None)
        if callable(is_available) and not is_available():
            raise InvalidArgumentError(f"{where}: torch.{dev.type}.is_available() is False here; use 'cpu'")
    return dev


def buffer_devices(device_: Any, storing_device: Any, buffer_size: Any) -> tuple[torch.device, torch.device]:
    """The two devices of ``ReplayBuffer(device, storing_device, buffer_size)``, checked with :func:`device`.
    A number where a device goes, or a device where the size goes, is Stable-Baselines3's order
    (``ReplayBuffer(buffer_size, observation_space, action_space, device)``): the message says so.

    Raises:
        InvalidArgumentError: naming the argument, as :func:`device`.
    """
    swapped = isinstance(buffer_size, (str, torch.device)) or (
        isinstance(device_, int) and not isinstance(device_, bool)
    )
    hint = " — ObjectRL's order is ReplayBuffer(device, storing_device, buffer_size)" if swapped else ""
    return device(device_, "device", hint=hint), device(storing_device, "storing_device", hint=hint)


def path(value: Any, name: str = "path") -> str:
    """``value`` (a ``str`` or ``os.PathLike`` of one) as a ``str`` naming a file: not empty and not
    ending in a folder separator (``save("")`` would write ``.metadata`` into the current folder).

    Raises:
        InvalidArgumentError: naming ``name`` and the value.
    """
    text = _text_path(value, name, "a file path like 'runs/buffer'")
    if text.endswith((os.sep, "/")) or (os.altsep is not None and text.endswith(os.altsep)):
        raise InvalidArgumentError(
            f"{name} must name a file, got {text!r}, a folder: give a name inside it, like {text + 'buffer'!r}"
        )
    return text


def folder(value: Any, name: str) -> str:
    """``value`` (a ``str`` or ``os.PathLike`` of one) as a ``str`` naming a folder that exists or can be
    made: neither it nor a parent is a file.

    Raises:
        InvalidArgumentError: naming ``name`` and the value (or the file in the way).
    """
    text = _text_path(value, name, "a folder path")
    ancestor = os.path.abspath(text)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if os.path.exists(ancestor) and not os.path.isdir(ancestor):
        raise InvalidArgumentError(f"{name} {text!r} cannot be a folder: {ancestor!r} is a file")
    return text


def _text_path(value: Any, name: str, expected: str) -> str:
    try:
        text = os.fspath(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be {expected} (str or os.PathLike), got {_brief(value)}") from None
    if isinstance(text, bytes):
        raise InvalidArgumentError(f"{name} must be a str or os.PathLike of str, got bytes {value!r}: os.fsdecode() it")
    if not text:
        raise InvalidArgumentError(f"{name} must be {expected}, got an empty string")
    return text


def slot_indices(indices: Any, ring: Ring, device: torch.device, name: str = "indices") -> torch.Tensor:
    """``indices`` (an int, a sequence or range of ints, an integer tensor) as a 1-D int64 tensor of slots of
    ``ring`` on ``device``.

    Raises:
        InvalidArgumentError: not integers (floats, bools and complex numbers are refused: a cast
            would read ``0.9`` as slot 0 and ``True`` as slot 1).
        SlotIndexError: a slot outside ``[0, len)``, or one counted but holding no data (after a
            metadata-only load).
    """
    if isinstance(indices, torch.Tensor):
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise InvalidArgumentError(f"{name} must be integers, got a tensor of dtype {indices.dtype}")
        slots = indices.to(device=device, dtype=torch.int64)
    else:
        try:
            # No dtype= here: it would truncate 0.9 to slot 0 and read True as slot 1.
            values = torch.as_tensor(indices if isinstance(indices, (Sequence, int, float)) else list(indices))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidArgumentError(f"{name} must be ints, a range, a list or a tensor of ints: {exc}") from None
        if values.numel() and (values.is_floating_point() or values.is_complex() or values.dtype == torch.bool):
            raise InvalidArgumentError(f"{name} must be integers, got {indices!r}")
        slots = values.to(device=device, dtype=torch.int64)
    slots = slots.reshape(-1)
    if slots.numel():
        low, high = int(slots.min()), int(slots.max())
        if low < 0 or high >= ring.size:
            bad = low if low < 0 else high
            raise SlotIndexError(f"index {bad} is out of range for a buffer of {ring.size} rows")
        if ring.phantom:
            phantom = ring.phantom_mask(slots)
            if bool(phantom.any()):
                bad = int(slots[phantom][0])
                raise SlotIndexError(
                    f"index {bad} is a slot that holds no data: the buffer counts {ring.size} rows, "
                    f"but only the newest {ring.held} were written since load() restored counters only"
                )
    return slots


def last_per_slot(slots: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``slots`` (1-D int64) and ``values`` (one each) with only the last value of each repeated slot."""
    if slots.numel() <= 1:
        return slots, values
    order = torch.sort(slots, stable=True).indices
    ordered = slots[order]
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    keep = order[last]
    return slots[keep], values[keep]
