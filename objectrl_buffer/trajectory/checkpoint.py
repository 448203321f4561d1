"""Checkpoints of a trajectory buffer: its :class:`~objectrl_buffer.trajectory.table.Table` to and from an
RLinf folder (:mod:`~objectrl_buffer.trajectory.files`), whole or one rank's share.

A save never overwrites a file an index names: over a folder that already holds a checkpoint (an index or
metadata), the new folder is built beside it and swapped in with one atomic ``renameat2(RENAME_EXCHANGE)``
(Linux), so a kill at any moment leaves exactly the old checkpoint or the new one. Where the exchange is not
supported, the old folder is renamed aside and the new one into place (a kill between the two renames leaves
no folder at the path, never a mix).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import stat
import tempfile
from dataclasses import replace
from typing import Any

import torch

from objectrl_buffer.checkpoint.io import fsync_path
from objectrl_buffer.core.schema import Key, format_key
from objectrl_buffer.core.sync import folder_held
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError, SchemaError
from objectrl_buffer.trajectory import files
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.table import Table, complete
from objectrl_buffer.trajectory.trajectory import OPTIONAL_FIELDS, from_payload

__all__ = ["write_folder", "check_rank", "rank_share", "read_table"]


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# what a trajectory folder holds (and the temp names of atomic_write): anything else is the user's
_OURS = re.compile(
    r"^(trajectory_\d+_[A-Za-z0-9_.\-]*\.(pt|pkl)|metadata\.json|trajectory_index\.json|trajector_index\.json)"
    r"(\.[0-9a-f]{8}\.tmp)?$"
)


def _load_renameat2() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):  # not Linux/glibc >= 2.28: the two-rename fallback
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    system or the filesystem does not support it (nothing was done). Other failures raise ``OSError``."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _holds_checkpoint(path: str) -> bool:
    return any(os.path.lexists(os.path.join(path, name)) for name in (files.METADATA, files.INDEX, files.LEGACY_INDEX))


def _write_into(path: str, table: Table, fmt: str, seed: Any, storage_dir: str, note: dict[str, Any] | None) -> None:
    """Every trajectory of ``table`` into ``path``: files, one batch sync, then index and metadata."""
    written, entries = [], []
    for i, entry in enumerate(table.entries):
        name = os.path.join(path, files.file_name(entry.trajectory_id, entry.model_weights_id, fmt))
        nbytes, crc = files.write_payload(name, table.payload(i), fmt, durable=False)
        written.append(name)
        entries.append(entry.with_file(nbytes, crc))
    files.sync_files(path, written)  # all durable (the kernel wrote most back meanwhile), then the index
    files.write_index(path, entries, fmt, seed, storage_dir=storage_dir, note=note)


def write_folder(path: str, table: Table, fmt: str, seed: Any, note: dict[str, Any] | None = None) -> None:
    """Write every trajectory of ``table`` to the folder ``path`` (see the module: a checkpoint already there
    is replaced by one atomic exchange; a new folder is renamed into place complete). A folder holding other
    files and no checkpoint is written in place, files first, then index and metadata; files of the user in a
    folder holding a checkpoint are kept (hard-linked into the new one). ``note``: more metadata keys
    (:func:`~objectrl_buffer.trajectory.files.write_index`).

    The storage_dir of a live writer (:class:`~objectrl_buffer.trajectory.writer.TrajectoryWriter`, of this
    process or another) is refused: the writer holds a kernel-released lock on its folder while it runs
    (:func:`~objectrl_buffer.core.sync.hold_folder`), checked here before anything is written. A writer
    that starts on the folder after that check is not seen.

    Raises:
        InvalidArgumentError: ``path`` is not a folder, is held by a live writer, or holds a checkpoint and
            something that is not a regular file.
        CheckpointError: writing failed (names the path); the old checkpoint is then intact.
    """
    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgumentError(f"save_path '{path}' exists and is not a folder")
    existing = os.path.isdir(path)
    if existing and folder_held(path):
        raise InvalidArgumentError(
            f"save_path '{path}' is the storage_dir of a live buffer whose writer keeps it (save_trajectories): "
            "a save would swap the folder away under it; save elsewhere, or close that buffer first"
        )
    if existing and not _holds_checkpoint(path) and os.listdir(path):
        _write_into(path, table, fmt, seed, path, note)  # no index there: no file an index names is overwritten
        return
    strays = [name for name in os.listdir(path) if not _OURS.match(name)] if existing else []
    for name in strays:
        if not stat.S_ISREG(os.lstat(os.path.join(path, name)).st_mode):
            raise InvalidArgumentError(
                f"save_path '{path}' holds a checkpoint and '{name}', which is not a regular file: a save replaces "
                "the whole folder, so save elsewhere or move it"
            )
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise CheckpointError(f"cannot save trajectories to '{path}': {exc.strerror or exc}") from exc
    old = None
    try:
        for name in strays:
            os.link(os.path.join(path, name), os.path.join(tmp, name))
        _write_into(tmp, table, fmt, seed, path, note)
        if not existing:
            os.rename(tmp, path)
        elif exchange(tmp, path):
            old = tmp
        else:
            old = tmp + ".old"
            os.rename(path, old)
            os.rename(tmp, path)
        fsync_path(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot save trajectories to '{path}': {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_rank(local_rank: Any, world_size: Any) -> int:
    """Check a sharded load's ``local_rank`` and ``world_size``; return ``world_size``.

    Raises:
        InvalidArgumentError: ``world_size`` < 1, ``local_rank`` outside ``[0, world_size)``.
    """
    world_size = positive_int(world_size, "world_size")
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or not 0 <= local_rank < world_size:
        raise InvalidArgumentError(f"local_rank ({local_rank!r}) must be in range [0, {world_size})")
    return world_size


def rank_share(entries: list[Entry], local_rank: int, world_size: int) -> list[Entry]:
    """Rank ``local_rank``'s contiguous share of ``entries``, the remainder going to the low ranks
    (10 entries over 3 ranks: 4, 3, 3)."""
    per, extra = divmod(len(entries), world_size)
    start = local_rank * per + min(local_rank, extra)
    return entries[start : start + per + (1 if local_rank < extra else 0)]


def read_table(
    folder: files.Folder,
    entries: list[Entry],
    capacity: int | None,
    device: torch.device,
    allow_pickle: bool,
    keep: int | None = None,
) -> Table:
    """A new table (``capacity``, ``keep``: see :class:`Table`) holding ``entries``' trajectory files of
    ``folder`` (rows on ``device``).

    Raises:
        CheckpointNotFoundError: files missing. CheckpointError: a file that does not match its entry or is
            damaged. InvalidArgumentError: a trajectory longer than ``capacity``. Nothing is left allocated.
    """
    paths = files.find_files(files.Folder(folder.path, folder.metadata, entries, folder.fmt))
    if len(set(paths)) != len(paths):  # the glob fallback found one file for two ids
        raise CheckpointError(f"'{folder.path}': two trajectories of the index resolve to the same file")
    table = Table(capacity, device, keep)
    try:
        schema = None
        first: tuple[str, dict[Key, tuple[torch.dtype, tuple[int, ...]]]] | None = None
        for entry, file in zip(entries, paths, strict=True):
            try:
                flat = from_payload(files.load_payload(file, allow_pickle, entry), f"'{file}'")
                first = first or (file, _fields(flat.rows))
                _check_same_fields(file, flat.rows, *first)
                rows, missing = complete(flat.rows, schema, f"'{file}'")  # a field RLinf left out: as an add
                schema, pairs, n = table.rows.prepare(rows, schema)
            except (InvalidArgumentError, SchemaError) as exc:  # the file's content, not the caller's argument
                raise CheckpointError(f"trajectory file '{file}' holds no valid trajectory: {exc}") from None
            if n != entry.num_samples:
                raise CheckpointError(f"'{file}' holds {n} transitions, its index entry says {entry.num_samples}")
            if capacity is not None and n > capacity:
                raise InvalidArgumentError(f"'{file}' has {n} transitions, more than capacity={capacity}")
            table.append(schema, pairs, n, replace(entry, heads=flat.heads), missing)  # T + E done rows, written back
    except BaseException:
        table.rows.close()
        raise
    return table


def _fields(rows: dict[Key, torch.Tensor]) -> dict[Key, tuple[torch.dtype, tuple[int, ...]]]:
    """Each field's dtype and per-row shape."""
    return {key: (value.dtype, tuple(value.shape[1:])) for key, value in rows.items()}


def _check_same_fields(
    file: str, rows: dict[Key, torch.Tensor], first_file: str, first: dict[Key, tuple[torch.dtype, tuple[int, ...]]]
) -> None:
    """Refuse a trajectory file whose fields differ from the first file's of the load (an extra field, another
    dtype or per-row shape: no cast, no reshape), naming both files and the field. Lacking one of RLinf's
    tensor fields (``OPTIONAL_FIELDS``, e.g. ``versions``) is no difference: RLinf writes only the fields a
    trajectory has, and the load fills it as an add does."""
    if file == first_file:
        return
    mine = _fields(rows)
    for key in [*first, *(k for k in mine if k not in first)]:
        if (key in mine or key not in OPTIONAL_FIELDS) and mine.get(key) != first.get(key):
            theirs = first.get(key)
            got = "no such field" if key not in mine else f"dtype {mine[key][0]}, rows of shape {list(mine[key][1])}"
            want = "no such field" if theirs is None else f"dtype {theirs[0]}, rows of shape {list(theirs[1])}"
            raise CheckpointError(
                f"trajectory file '{file}' does not match the schema of the load's first file '{first_file}': "
                f"field '{format_key(key)}' has {got} there, {want} in '{first_file}'"
            )
