"""Merge per-rank trajectory folders into one, or split the first N trajectories off one (RLinf's toolkit).

Unlike RLinf's ``merge_or_split_replay_buffer.py`` (which moves the user's files by default and writes in
place), both tools copy by default and build the destination in a temp folder beside it, renamed into
place at the end: a failure leaves the source untouched and no half-made destination. ``move=True``
removes the source's files only after the destination is complete. Source files are read as the loader
reads them (regular files only, never a symlink out of the folder or a FIFO; checked against their index's
size and crc32 where it records them), and the destination's index records each copy's size and crc32.
A ``rank_*`` entry of a merge's source that is not a real folder (a symlink, never followed: ``move`` would
empty the folder it points to) is refused before anything is copied or moved.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from objectrl_buffer.checkpoint.io import file_kind, fsync_path, progress_bar
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from objectrl_buffer.trajectory import files
from objectrl_buffer.trajectory.files import Entry, Folder

__all__ = ["merge_rank_folders", "split_folder"]

#: Files copied (and fsynced) at once.
COPY_THREADS = 8
_RANK = re.compile(r"^rank_(\d+)$")


def _check_destination(destination: str, sources: list[str]) -> None:
    if os.path.exists(destination) and (not os.path.isdir(destination) or os.listdir(destination)):
        raise InvalidArgumentError(f"save path '{destination}' already exists and is not an empty folder")
    real = os.path.realpath(destination)
    for source in sources:
        if real == os.path.realpath(source) or real.startswith(os.path.realpath(source) + os.sep):
            raise InvalidArgumentError(f"save path '{destination}' must lie outside the source '{source}'")


def _publish(destination: str, items: list[tuple[str, Entry]], fmt: str, seed: Any, progress: bool | None) -> None:
    """Copy ``(source file, new entry)`` pairs into a temp folder, index it, rename it to ``destination``."""
    destination = os.path.abspath(destination)
    parent = os.path.dirname(destination)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(destination)}.", suffix=".tmp", dir=parent)
    try:
        total = sum(os.lstat(path).st_size for path, _ in items)

        def copy(item: tuple[str, Entry]) -> Entry:
            path, entry = item
            target = os.path.join(tmp, files.file_name(entry.trajectory_id, entry.model_weights_id, fmt))
            return files.copy_file(path, target, entry)  # fsynced: durable before the folder is renamed into place

        # fsync waits on the device with the GIL released: several in flight overlap their waits
        copied = []
        asked = bool(progress)  # True: at once and kept (a command on a terminal); None: after 0.5 s, erased
        shown = progress_bar(total, "copying trajectories", progress, delay=0.0 if asked else 0.5, leave=asked)
        with shown as bar, ThreadPoolExecutor(COPY_THREADS) as pool:
            for entry in pool.map(copy, items):
                copied.append(entry)
                bar.update(entry.nbytes or 0)
        files.write_index(tmp, copied, fmt, seed, legacy=True, storage_dir=destination)
        if os.path.isdir(destination):
            os.rmdir(destination)  # empty (checked): rename needs it gone
        os.rename(tmp, destination)
        fsync_path(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _rank_folders(source: str) -> list[str]:
    if not os.path.isdir(source):
        raise CheckpointNotFoundError(f"source path '{source}' is not a folder")
    # RLinf's toolkit sorts the names as text (rank_10 before rank_2): the same order, so the same ids
    found = [os.path.join(source, name) for name in sorted(os.listdir(source)) if _RANK.match(name)]
    for path in found:  # all checked before anything is read, copied or (--move) removed
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):  # a symlink is never followed: --move would empty the folder it points to
            raise CheckpointError(f"'{path}' is a {file_kind(mode)}, expected a rank folder inside '{source}'")
    if not found:
        raise CheckpointNotFoundError(f"no rank_* folders found in '{source}'")
    return found


def merge_rank_folders(
    source_path: str | os.PathLike[str],
    save_path: str | os.PathLike[str],
    *,
    move: bool = False,
    progress: bool | None = None,
) -> int:
    """Merge the ``rank_*`` folders of ``source_path`` into ``save_path``.

    Ids are renumbered ``0..`` in (original id, rank) order, interleaving the ranks, with the ranks in RLinf's
    order: their names sorted as text (``rank_0, rank_1, rank_10, rank_11, rank_2, ...``), so the ids equal
    those RLinf's ``merge_or_split_replay_buffer.py`` gives for any number of ranks (of ten or more, a
    numeric order would number same-id trajectories of ``rank_10`` and ``rank_2`` the other way round). Only
    folders named ``rank_`` and digits are merged. The metadata takes the first rank's seed
    (``rank_0``'s) and both index file names are written: ``trajectory_index.json``
    and ``trajector_index.json``, the misspelled name RLinf's merge tool writes and RLinf's loader reads (so
    that RLinf loads the merged folder; our loader reads either). Returns the count.

    ``progress``: a tqdm bar over the bytes copied (with tqdm installed). ``None`` (default): only when
    stderr is a terminal and no ``CI`` variable is set, once the copy has lasted half a second, erased when
    done; ``True``: at once, left on screen when done (what ``objectrl-buffer trajectories merge`` asks for
    on a terminal); ``False``: none.

    Raises:
        CheckpointNotFoundError (FileNotFoundError): no ``rank_*`` folder, or a file an index names is missing.
        CheckpointError: a ``rank_*`` entry that is not a real folder (a symlink, never followed, or a file
            of any kind), named, before anything is copied or moved; a damaged index or file.
        InvalidArgumentError (ValueError): ranks with different formats, or ``save_path`` not empty.
    """
    source, destination = os.fspath(source_path), os.fspath(save_path)
    ranks = _rank_folders(source)
    _check_destination(destination, [source])
    folders = [files.read_folder(path) for path in ranks]
    formats = {f.fmt for f in folders}
    if len(formats) > 1:
        raise InvalidArgumentError(f"the rank folders of '{source}' mix trajectory formats {sorted(formats)}")
    found = []
    for rank, folder in enumerate(folders):
        for path, entry in zip(files.find_files(folder), folder.entries, strict=True):
            found.append((entry.trajectory_id, rank, path, entry))
    found.sort(key=lambda item: (item[0], item[1]))
    items = [(path, entry.renumbered(i)) for i, (_, _, path, entry) in enumerate(found)]
    _publish(destination, items, folders[0].fmt, folders[0].seed, progress)
    if move:
        for folder in folders:
            _remove_folder_files(folder)
    return len(items)


def split_folder(
    source_path: str | os.PathLike[str],
    save_path: str | os.PathLike[str],
    split_count: int,
    *,
    move: bool = False,
    progress: bool | None = None,
) -> int:
    """Copy the first ``split_count`` trajectories of ``source_path`` (index order) to ``save_path``,
    renumbered ``0..split_count-1`` as RLinf does. With ``move`` they leave the source, whose index then
    names the rest. Returns ``split_count``. ``progress``: as for
    :func:`merge_rank_folders`.

    Raises:
        InvalidArgumentError (ValueError): ``split_count`` <= 0 or more than the folder holds; ``save_path`` not empty.
        CheckpointNotFoundError (FileNotFoundError): the folder's metadata, index or a file is missing.
    """
    source, destination = os.fspath(source_path), os.fspath(save_path)
    if isinstance(split_count, bool) or not isinstance(split_count, int) or split_count <= 0:
        raise InvalidArgumentError(f"split_count must be a positive int, got {split_count!r}")
    folder = files.read_folder(source)
    if split_count > len(folder.entries):
        raise InvalidArgumentError(
            f"split_count={split_count} is more than the {len(folder.entries)} trajectories in '{source}'"
        )
    _check_destination(destination, [source])
    taken = Folder(folder.path, folder.metadata, folder.entries[:split_count], folder.fmt)
    paths = files.find_files(taken)
    items = [(path, entry.renumbered(i)) for i, (path, entry) in enumerate(zip(paths, taken.entries, strict=True))]
    _publish(destination, items, folder.fmt, folder.seed, progress)
    if move:
        rest = folder.entries[split_count:]
        files.write_index(source, rest, folder.fmt, folder.seed)  # the index stops naming them first
        for path in paths:
            os.unlink(path)
    return split_count


def _remove_folder_files(folder: Folder) -> None:
    """After a move: the folder's index and metadata (it no longer is a buffer), then its trajectory files."""
    paths = files.find_files(folder)
    for name in (files.METADATA, files.INDEX, files.LEGACY_INDEX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder.path, name))
    for path in paths:
        os.unlink(path)
