"""The bookkeeping of a shared compact buffer's env streams: overlap checks, per-row links, frame plans.

See :mod:`~objectrl_buffer.distributed.shared_compact` for the layout. A row's links are int64
``[3 + D]``: the ticket of the row whose ``start`` entry holds its older frames (``-1``: none), its distance
from that row in stream steps, bits of the keys whose next stack is stored whole (``end``), then the tickets
of its ``D`` stream predecessors, nearest first (``-1`` where it does not borrow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from objectrl_buffer.core.schema import Field, Key, format_key
from objectrl_buffer.errors import SchemaError

__all__ = ["Observed", "Stream", "check_overlaps", "link_rows", "plan_frames", "ANCHOR", "DIST", "ENDS", "PREDS", "TAG"]

ANCHOR, DIST, ENDS, PREDS = 0, 1, 2, 3
TAG = "_compact"  # first part of the internal column keys


@dataclass(frozen=True)
class Observed:
    """One observed key: its field, stack length ``k`` (1 unstacked), next key (or ``None``), column names."""

    field: Field
    k: int
    stacked: bool
    next: Key | None
    index: int

    @property
    def depth(self) -> int:
        """Predecessors a row borrows frames from."""
        return self.k if self.next is not None else self.k - 1

    @property
    def frame_bytes(self) -> int:
        return self.field.row_bytes // self.k

    def column(self, part: str) -> Key:
        return (TAG, str(self.index), part)


@dataclass
class Stream:
    """What a handle knows of one of its env streams: its newest rows' tickets and values."""

    preds: list[int] = field(default_factory=list)  # tickets of the newest rows, newest first
    anchor: int = -1
    dist: int = 0
    ended: bool = True  # no row yet, or the last one ended an episode
    last: dict[Key, np.ndarray] = field(default_factory=dict)  # per observed key: the value the next row continues


def check_overlaps(
    streams: list[Stream],
    observed: list[Observed],
    raw: dict[Key, np.ndarray],
    raw_next: dict[Key, np.ndarray],
    ended: np.ndarray,
    n: int,
) -> tuple[np.ndarray, list[dict[Key, np.ndarray]]]:
    """Check each row (raw bytes ``[n, ...]``; row ``i`` of stream ``i % len(streams)``; ``ended``: bool ``[n]``)
    against its stream's previous row, raising ``SchemaError`` naming the key; return, per row,
    which keys' next stacks do not shift the row's own (bits, as the links' end bits), and each stream's
    values the next write continues (nothing is changed).


    which keys' next stacks do not shift the row's own (bits, as the links' end bits), and each stream's
    values the next write continues."""
    envs = len(streams)
    shifts = np.zeros(n, dtype=np.int64)
    last = [dict(s.last) for s in streams]
    linked = [not s.ended for s in streams]
    for i in range(n):
        e = i % envs
        for o in observed:
            x = raw[o.field.key][i]
            frames = x.reshape(o.k, -1)
            if linked[e]:
                before = last[e][o.field.key]
                if o.next is not None:
                    if x.tobytes() != before.tobytes():
                        refuse(o.field.key, i, e, f"'{format_key(o.field.key)}' of", f"'{o.next}' of")
                elif o.k > 1 and frames[:-1].tobytes() != before.reshape(o.k, -1)[1:].tobytes():
                    refuse(o.field.key, i, e, "frames 0..k-2 of", "1..k-1 of")
            if o.next is not None:
                nx = raw_next[o.next][i]
                same = o.k == 1 or nx.reshape(o.k, -1)[:-1].tobytes() == frames[1:].tobytes()
                if not same and not ended[i]:
                    refuse(o.next, i, e, "frames 0..k-2 of", f"frames 1..k-1 of '{o.field.key}' in", True)
                shifts[i] |= int(not same) << o.index
                last[e][o.field.key] = nx
            else:
                last[e][o.field.key] = x
        linked[e] = not ended[i]
    return shifts, last


def link_rows(
    streams: list[Stream], seq: int, n: int, keep: int, ended: np.ndarray, shifts: np.ndarray, depth: int, margin: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``seq .. seq + n - 1`` (the newest ``keep`` stored; row ``i`` of stream ``i % len(streams)``):
    each row's links (int64 ``[n, 3 + D]``) and whether it stores its whole value (``start``: it begins
    an episode, follows a row that is not stored, or would borrow from more than ``margin`` tickets back);
    advances the streams."""
    envs = len(streams)
    links = np.full((n, 3 + depth), -1, dtype=np.int64)
    links[:, ENDS] = shifts
    side = np.zeros(n, dtype=bool)
    for i in range(n):
        s = streams[i % envs]
        r = seq + i
        stored = i - envs >= n - keep if n > keep else True  # is the previous row of the stream stored?
        anchor, dist = r, 0
        if not s.ended and stored and s.preds:
            dist = s.dist + 1
            anchor = s.anchor if dist < depth else -1
            used = s.preds[: min(depth, dist)] if anchor >= 0 else s.preds[:depth]
            if anchor >= 0:
                used = [*used, anchor]
            if len(s.preds) < min(depth, dist) or min(used) < r - margin:
                anchor, dist = r, 0  # a slow stream among fast ones: borrow nothing
        links[i, ANCHOR], links[i, DIST] = anchor, dist
        if anchor == r:
            side[i] = True
            s.preds = [r]
        else:
            links[i, PREDS : PREDS + len(s.preds)] = s.preds
            s.preds = [r, *s.preds][:depth]
        s.anchor, s.dist, s.ended = anchor, dist, bool(ended[i])
    return links, side


def plan_frames(o: Observed, links: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per frame ``i`` of ``o``'s stack: ``(the ticket whose frame it is, the row's own for ``b = 0``, from the anchor's
    start?, frame of that start)`` per row."""
    anchor, dist, seqs = links[:, ANCHOR], links[:, DIST], links[:, -1]
    plan = []
    for i in range(o.k):
        b = o.k - i if o.next is not None else o.k - 1 - i
        if b == 0:
            plan.append((seqs, np.zeros(len(seqs), dtype=bool), np.zeros(len(seqs), dtype=np.int64)))
            continue
        from_anchor = (anchor >= 0) & (b > dist)
        ticket = np.where(from_anchor, anchor, links[:, PREDS + b - 1])
        plan.append((ticket, from_anchor, np.clip(i + dist, 0, o.k - 1)))
    return plan


def refuse(key: Key, row: int, env: int, ours: str, theirs: str, same_row: bool = False) -> None:
    where = "the same row, which does not end an episode" if same_row else "the stream's previous row"
    raise SchemaError(
        f"key '{format_key(key)}': {ours} row {row} of this write (env {env}) differ from {theirs} {where}; "
        "next_of/frame_stack promise they are equal. Nothing was stored"
    )
