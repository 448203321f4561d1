"""Admission tickets: the rows a lost coordinator admitted are counted by the one Ray restarted (issue 23, bug 4).

A restarted coordinator rebuilds the limiter's counters from the shards' own counts
(:meth:`.shard.Shard.counts`). A write the dead coordinator admitted and that reached its shard only after that
shard answered the rebuild would be stored but never counted. So every admission answers with a *ticket*,
the admitting coordinator's incarnation (a random id each actor start), and the write carries it to the shard:

* the shard (:class:`LateWrites`) remembers which incarnation rebuilt from its counts; a write whose ticket is
  another incarnation's, stored after that rebuild, is *late*: stored as any other and added to
  :attr:`LateWrites.rows`;
* the restarted coordinator (:class:`LateTally`) reads each shard's late rows once a second, and when asked for
  its counters, and counts the rows it has not counted yet as inserted (and what they evicted).

Writes sent before the rebuild are in the counts it read; writes after it are counted as late: each row once.
A shard that itself restarts forgets which incarnation rebuilt from it: it keeps its rows per ticket until
the restarted coordinator next asks for late rows (naming its own ticket), and then counts those of other
tickets as late. A lost write sent again is never late: its rows were counted when first written.
"""

from __future__ import annotations

import uuid

__all__ = ["LateTally", "LateWrites", "new_ticket"]


def new_ticket() -> str:
    """A coordinator incarnation's id: what its admissions answer, and its writes carry to the shards."""
    return uuid.uuid4().hex


class LateWrites:
    """A shard's count of late rows (see the module docs); one per shard actor start."""

    def __init__(self) -> None:
        self.incarnation = new_ticket()  # this shard actor's start: a restart counts from 0 again
        self.rebuilt_by: str | None = None  # the coordinator incarnation that last rebuilt from this shard
        self.rows = 0
        #: rows stored per ticket before any coordinator named itself to this actor (see :meth:`report`)
        self.unplaced: dict[str, int] = {}

    def rebuilt(self, by: str) -> None:
        """The coordinator incarnation ``by`` read this shard's counts: writes of other tickets are late now.
        The late rows so far are in those counts: the count starts again (else ``by`` would count them twice)."""
        self.rebuilt_by = by
        self.rows = 0
        self.unplaced.clear()

    def note(self, ticket: str | None, n: int) -> None:
        """``n`` rows stored under ``ticket`` (``None``: written without a limiter), first written here (a lost
        write sent again was counted when it was first written: the shard does not note it)."""
        if ticket is None:
            return
        if self.rebuilt_by is None:
            self.unplaced[ticket] = self.unplaced.get(ticket, 0) + n
        elif ticket != self.rebuilt_by:
            self.rows += n

    def report(self, current: str | None = None) -> tuple[str, int]:
        """``(incarnation, late rows)``: what :meth:`LateTally.take` reads. ``current``: the asking
        coordinator's ticket. A shard actor that no coordinator rebuilt from (it restarted after the rebuild)
        takes it as its rebuilder: the rows it stored meanwhile under other tickets are late too."""
        if current is not None and self.rebuilt_by is None:
            self.rebuilt_by = current
            self.rows += sum(n for ticket, n in self.unplaced.items() if ticket != current)
            self.unplaced.clear()
        return self.incarnation, self.rows


class LateTally:
    """The late rows a coordinator has counted already, per shard (see the module docs)."""

    def __init__(self, num_shards: int) -> None:
        self.seen: list[tuple[str, int]] = [("", 0)] * num_shards

    def take(self, shard: int, report: tuple[str, int]) -> int:
        """The late rows of ``shard``'s ``report`` not counted yet (a restarted shard's count starts again)."""
        incarnation, rows = report
        before = self.seen[shard][1] if self.seen[shard][0] == incarnation else 0
        self.seen[shard] = (incarnation, rows)
        return max(0, rows - before)
