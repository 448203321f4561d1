"""The checkpoint cut of a remote buffer: one folder per generation, one manifest naming the newest.

``checkpoint_path/`` holds

* ``gen-<12 digits>/shard-<i>.metadata`` (+ its data folder): each shard's full checkpoint, written by the
  library's crash-safe :meth:`~objectrl_buffer.ReplayBuffer.save` (``data=True``);
* ``checkpoint.json``: the manifest, replaced atomically (:func:`~objectrl_buffer.checkpoint.io.atomic_write`)
  only after every shard of a generation is durable: it names the generation, the shards' row counts and
  the rate limiter's counters. A generation the manifest does not name is never loaded;
* ``shard-<i>.journal``: what each shard wrote since its last committed checkpoint (``writer seq rows
  written epoch``, one line per write, not fsynced: it survives the death of the process, which is what it is
  for). ``epoch`` counts the shard's lifetimes (0 at its first start, one more at each reload): after a
  restart ``written`` counts again from the reloaded checkpoint's, so the lines of two lifetimes are told
  apart by it (a line of 4 fields, from an older version, is of epoch 0).

Loading reads JSON only (nothing is unpickled). ``root`` is a :class:`~.location.Location` (or a local path or
URI, opened as one): the files above are read and written through it, on a local disk or on shared or object
storage alike (the manifest with one atomic replace or one PUT, see :mod:`.location`).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from objectrl_buffer.distributed.location import Location, as_location
from objectrl_buffer.errors import CheckpointError

__all__ = [
    "MANIFEST",
    "JournalLine",
    "generation_folder",
    "generation_name",
    "journal_line",
    "journal_name",
    "journal_path",
    "prune",
    "read_journal",
    "read_manifest",
    "shard_name",
    "shard_path",
    "write_manifest",
]

MANIFEST = "checkpoint.json"
_FOLDER = re.compile(r"gen-(\d{12})")
_LIMIT = 1 << 20


def generation_name(generation: int) -> str:
    """The folder of checkpoint generation ``generation``, relative to the root."""
    return f"gen-{generation:012d}"


def shard_name(generation: int, shard: int) -> str:
    """The ``save`` path of shard ``shard`` in generation ``generation``, relative to the root."""
    return f"{generation_name(generation)}/shard-{shard}"


def journal_name(shard: int) -> str:
    """The write journal of shard ``shard``, relative to the root."""
    return f"shard-{shard}.journal"


def generation_folder(root: Location | str, generation: int) -> str:
    """The folder of checkpoint generation ``generation`` under ``root``."""
    return as_location(root).path(generation_name(generation))


def shard_path(root: Location | str, generation: int, shard: int) -> str:
    """The ``save`` path of shard ``shard`` in generation ``generation`` under ``root``."""
    return as_location(root).path(shard_name(generation, shard))


def journal_path(root: Location | str, shard: int) -> str:
    """The write journal of shard ``shard`` under ``root``."""
    return as_location(root).path(journal_name(shard))


class JournalLine(NamedTuple):
    """One write of a shard: its ``(writer, seq)``, its ``rows``, the shard's rows ``written`` after it, and
    the shard's lifetime ``epoch``."""

    writer: str
    seq: int
    rows: int
    written: int
    epoch: int


def journal_line(line: JournalLine) -> str:
    """``line`` as the journal holds it (one text line)."""
    return f"{line.writer} {line.seq} {line.rows} {line.written} {line.epoch}\n"


def read_journal(root: Location | str, shard: int) -> list[JournalLine]:
    """The complete lines of shard ``shard``'s journal (a last line cut short by a crash is not one); none
    when there is no journal.

    Raises:
        CheckpointError: a line that is not a journal line (the message names the file and the line).
    """
    location = as_location(root)
    path = location.path(journal_name(shard))
    payload = location.read_bytes(journal_name(shard), 1 << 30)
    if payload is None:
        return []
    text = [line for line in payload.decode(errors="replace").splitlines(keepends=True) if line.endswith("\n")]
    out = []
    for number, line in enumerate(text, 1):
        fields = line.split()
        try:
            if len(fields) not in (4, 5):
                raise ValueError(f"{len(fields)} fields")
            out.append(JournalLine(fields[0], *(int(v) for v in fields[1:]), *([0] if len(fields) == 4 else [])))
        except ValueError as exc:
            raise CheckpointError(f"'{path}' line {number} is not a journal line: {exc}") from None
    return out


def read_manifest(root: Location | str) -> dict[str, Any] | None:
    """The manifest under ``root``, or ``None`` when there is none yet.

    Raises:
        CheckpointError: it is not a manifest of this format (the message names the file).
    """
    location = as_location(root)
    path = location.path(MANIFEST)
    payload = location.read_bytes(MANIFEST, _LIMIT)
    if payload is None:
        return None
    try:
        manifest = json.loads(payload)
        if not (isinstance(manifest, dict) and manifest.get("format") == 1 and isinstance(manifest["generation"], int)):
            raise ValueError("not format 1")
        return manifest
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"'{path}' is not a remote-buffer manifest: {exc}") from None


def write_manifest(root: Location | str, manifest: dict[str, Any]) -> None:
    """Atomically replace the manifest under ``root`` (the commit point of a generation)."""
    as_location(root).write_bytes(MANIFEST, json.dumps(dict(manifest, format=1), sort_keys=True).encode())


def prune(root: Location | str, keep: set[int]) -> None:
    """Remove the generation folders under ``root`` not in ``keep`` (older ones, or a cut never committed)."""
    location = as_location(root)
    for name in location.listdir():
        match = _FOLDER.fullmatch(name)
        if match and int(match.group(1)) not in keep:
            location.remove(name)
