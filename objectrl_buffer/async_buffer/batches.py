"""Checks and normalisation of the arguments of ``put_batch`` and ``amend_batch``.

Each function either returns the normalised argument or raises naming it, before the buffer changes.
"""

from __future__ import annotations

import time
from collections.abc import Container, Hashable, Sequence
from typing import Any

import torch

from objectrl_buffer.async_buffer.slots import EMPTY_ID
from objectrl_buffer.core.casts import exact_ints
from objectrl_buffer.errors import InvalidArgumentError, SlotIndexError

__all__ = ["birth_times", "check_new_ids", "amend_slots", "check_amend_ids"]

#: The ids (and birth times) the slot table holds: int64.
INT64_MIN, INT64_MAX = exact_ints(torch.int64)


def birth_times(value: Any, n: int, last_birth: int) -> torch.Tensor:
    """``value`` as int64 ``[n]``; by default monotonic ns, increasing and after ``last_birth``.

    Raises:
        InvalidArgumentError: not a 1-D integer sequence of length ``n``.
    """
    if value is None:
        start = max(time.monotonic_ns(), last_birth + 1)  # strictly after everything stored
        if start + n - 1 > INT64_MAX:
            raise InvalidArgumentError(
                f"birth_times: the default birth times follow the latest one stored ({last_birth}) and would pass "
                f"the int64 maximum {INT64_MAX}; give birth_times explicitly"
            )
        return torch.arange(start, start + n, dtype=torch.int64)
    try:
        births = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidArgumentError(f"birth_times must be {n} integers, got {value!r}") from None
    if births.shape == (0,) and not isinstance(value, torch.Tensor):
        births = births.to(torch.int64)  # an empty list or array has torch's (NumPy's) default float dtype
    if births.dim() != 1 or births.shape[0] != n or births.dtype not in (torch.int64, torch.int32):
        raise InvalidArgumentError(
            f"birth_times must be a 1-D integer sequence of length {n} (one per sample), got "
            f"{births.dtype} of shape {list(births.shape)}"
        )
    return births.to(torch.int64)


def _shown(value: Hashable) -> Hashable:
    """An id as a message shows it: a huge int (beyond 4300 digits ``str`` refuses it) by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<an int of {value.bit_length()} bits>"
    return value


def id_kind(ids: list[Hashable], int_ids: bool | None) -> bool:
    """Whether ``ids`` (of one put) are ints; refuse a put that mixes ints with other ids, or that differs from
    what the buffer holds (``int_ids``; ``None`` before the first put).

    Raises:
        InvalidArgumentError: naming both kinds.
    """
    ints = [type(i) is int for i in ids]
    kind = all(ints)
    if not kind and any(ints):
        raise InvalidArgumentError(
            "samples: ids mix ints with other ids (e.g. str); one buffer's ids are all ints or all of other kinds"
        )
    if int_ids is not None and kind != int_ids:
        held = "ints" if int_ids else "not ints (e.g. str)"
        raise InvalidArgumentError(
            f"samples: this buffer's ids are {held} (fixed by its first put), got ids {[_shown(i) for i in ids[:10]]}"
        )
    return kind


def check_new_ids(ids: list[Hashable], stored: Container[Hashable], int_ids: bool | None = None) -> bool:
    """Refuse ``ids`` of a put that the buffer cannot hold, repeat within the batch or are already ``stored``;
    return whether they are ints.

    An id is either an int64 other than ``-1`` (the empty-slot marker, kept so that a batch's ``ids`` stay an
    int64 tensor) or any other hashable (a str, ...); ``int_ids`` is what the buffer holds (see :func:`id_kind`).
    Checked before any slot is taken: a refused batch stores none of its samples.

    Raises:
        InvalidArgumentError: naming ``ids`` and (up to 10 of) the offending ids.
    """
    kind = id_kind(ids, int_ids) if ids else bool(int_ids)
    if kind and ids and (min(ids) < INT64_MIN or max(ids) > INT64_MAX or EMPTY_ID in ids):  # type: ignore[type-var, operator]
        bad = [_shown(i) for i in ids if i == EMPTY_ID or not INT64_MIN <= i <= INT64_MAX]  # type: ignore[operator]
        raise InvalidArgumentError(
            f"samples: ids {bad[:10]} cannot be stored: an id is an int64 ([-2**63, 2**63 - 1]) other than "
            f"{EMPTY_ID}, which marks an empty slot"
        )
    if len(set(ids)) != len(ids):
        seen: set[Hashable] = set()
        dups = list(dict.fromkeys(i for i in ids if i in seen or seen.add(i)))  # type: ignore[func-returns-value]
        twice = sorted(dups) if kind else dups  # type: ignore[type-var]
        raise InvalidArgumentError(f"samples: ids {twice[:10]} appear more than once in the batch")
    already = [i for i in ids if i in stored]
    if already:
        raise InvalidArgumentError(f"samples: ids {already[:10]} are already in the buffer")
    return kind


def amend_slots(indices: Any, occupied: torch.Tensor, held: Sequence[object] | None = None) -> torch.Tensor:
    """``indices`` of an amend as int64 ``[k]`` CPU slots, each occupied (``occupied``: bool ``[max_size]``;
    ``held``, when given: each slot's id, ``None`` when empty, the same in Python, for the common case).

    Raises:
        SlotIndexError: a slot out of range or empty. InvalidArgumentError: not 1-D integers, or a slot twice.
    """
    max_size = occupied.numel()
    if isinstance(indices, torch.Tensor) and indices.dim() == 1 and indices.dtype == torch.int64 and indices.numel():
        listed = indices.tolist()  # the common case (the slots a put returned): checked in Python, no torch ops
        if (
            held is not None
            and min(listed) >= 0
            and max(listed) < max_size
            and len(set(listed)) == len(listed)
            and all(held[s] is not None for s in listed)
        ):
            return indices.cpu()
    try:
        slots = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidArgumentError(f"indices must be integer slots, got {indices!r}") from None
    if slots.dim() == 0:
        slots = slots.reshape(1)
    if slots.dim() != 1 or (slots.numel() and slots.dtype not in (torch.int64, torch.int32, torch.int16)):
        raise InvalidArgumentError(f"indices must be a 1-D sequence of integer slots, got {slots.dtype} {slots}")
    slots = slots.to(torch.int64).cpu()
    if slots.numel():
        bad = slots[(slots < 0) | (slots >= max_size)]
        if bad.numel():
            raise SlotIndexError(f"indices {bad[:10].tolist()} are out of range [0, {max_size})")
        empty = slots[~occupied[slots]]
        if empty.numel():
            raise SlotIndexError(f"indices {empty[:10].tolist()} are empty slots (never put, or already freed)")
        if torch.unique(slots).numel() != slots.numel():
            raise InvalidArgumentError(f"indices {slots.tolist()} name a slot more than once")
    return slots


def check_amend_ids(slots: list[int], stored: list[Hashable], ids: list[Hashable]) -> None:
    """Refuse an amend whose sample ``ids`` differ from the ids ``stored`` in its ``slots``.

    Raises:
        InvalidArgumentError: naming the first slot that differs.
    """
    wrong = [(s, a, b) for s, a, b in zip(slots, stored, ids, strict=True) if a != b]
    if wrong:
        s, a, b = wrong[0]
        raise InvalidArgumentError(f"amend_batch: slot {s} holds ids {a}, the sample amending it has ids {b}")
