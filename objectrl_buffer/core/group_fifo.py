"""Whole-group FIFO eviction: rows belong to groups (tasks, episodes); when a store would pass the capacity,
the group inserted first goes, all its rows at once, never a part of one.

Pure bookkeeping on group keys (any hashables): a storage plans a store with :func:`plan_store`, then applies
the plan to its rows. Planning changes nothing, so a store that cannot fit raises before touching anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["GroupCounts", "StorePlan", "plan_store"]


@dataclass
class GroupCounts:
    """Rows held per group, groups in order of first insertion (the eviction order)."""

    rows: OrderedDict[Hashable, int] = field(default_factory=OrderedDict)
    total: int = 0

    def copy(self) -> GroupCounts:
        return GroupCounts(OrderedDict(self.rows), self.total)


@dataclass
class StorePlan:
    """What a store does: ``evicted`` groups held before it lose all their rows (oldest first); ``keep[i]``
    says whether incoming row ``i`` is still held at the end (False when its group was evicted later in the
    same batch); :attr:`after` is the bookkeeping once applied (:meth:`apply` gives the same without a copy)."""

    evicted: list[Hashable]
    keep: list[bool]
    _after: GroupCounts | None = field(default=None, repr=False)
    _base: GroupCounts | None = field(default=None, repr=False)  # when nothing is evicted: the counts planned on
    _added: dict[Hashable, int] = field(default_factory=dict, repr=False)  # ... and the rows added per group
    _applied: bool = field(default=False, repr=False)

    @property
    def after(self) -> GroupCounts:
        """The bookkeeping once applied (a new object; the counts planned on are unchanged)."""
        if self._after is None:
            assert self._base is not None and not self._applied
            self._after = _add(self._base.copy(), self._added)
        return self._after

    def apply(self) -> GroupCounts:
        """:attr:`after`, made by updating the counts planned on in place when nothing is evicted (no copy of
        every group per store). For a caller about to replace those counts with the result; call it once."""
        if self._after is not None:
            return self._after
        assert self._base is not None and not self._applied
        self._applied = True
        return _add(self._base, self._added)


def _add(counts: GroupCounts, added: dict[Hashable, int]) -> GroupCounts:
    rows = counts.rows
    for group, n in added.items():  # first-seen order: new groups join the FIFO as if stored one by one
        rows[group] = rows.get(group, 0) + n
        counts.total += n
    return counts


def plan_store(
    counts: GroupCounts, groups: Sequence[Hashable], capacity: int, name: Callable[[Hashable], object] = repr
) -> StorePlan:
    """Plan storing rows of ``groups`` (one key per incoming row, in order) as if stored one by one.

    Before each row, while the total is at ``capacity``, the oldest group other than the row's own is evicted.
    Raises :class:`InvalidArgumentError` (nothing planned, nothing changed) when a single group would need
    more than ``capacity`` rows.
    """
    if counts.total + len(groups) <= capacity:  # everything fits: nothing evicted, no group can overflow
        added: dict[Hashable, int] = {}
        for group in groups:
            added[group] = added.get(group, 0) + 1
        return StorePlan([], [True] * len(groups), _base=counts, _added=added)
    after = counts.copy()
    held_before = set(counts.rows)
    evicted: list[Hashable] = []
    pending: dict[Hashable, list[int]] = {}
    keep = [True] * len(groups)
    for i, group in enumerate(groups):
        while after.total >= capacity:
            oldest = next((g for g in after.rows if g != group), None)
            if oldest is None:
                raise InvalidArgumentError(
                    f"task {name(group)} would hold {after.rows[group] + 1} rows, more than max_capacity={capacity}"
                )
            after.total -= after.rows.pop(oldest)
            if oldest in held_before:
                held_before.discard(oldest)
                evicted.append(oldest)
            for j in pending.pop(oldest, ()):
                keep[j] = False
        after.rows[group] = after.rows.get(group, 0) + 1
        after.total += 1
        pending.setdefault(group, []).append(i)
    return StorePlan(evicted, keep, after)
