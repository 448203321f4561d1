"""Checkpoint generations: save and load a buffer, crash-safe.

A checkpoint at ``path`` is

* ``<path>.metadata``: ObjectRL's dict of ints, naming the data folder (:mod:`.metadata`);
* with ``data=True`` only: ``<path>.data-<16 hex digits>/``, one folder per save ("generation"), laid
  out as :mod:`objectrl_buffer.checkpoint.data` describes.

Crash safety comes from the order of a save: the new generation folder is written and fsynced
completely, then the metadata file is atomically replaced (temp file, fsync, ``os.replace``, fsync of
the folder) to name it, and only then are older generations deleted (on a background thread that the
interpreter waits for at exit, so ``save`` returns as soon as the new checkpoint is durable). A crash
at any moment leaves the metadata naming either the complete old generation or the complete new one;
half-written or unreferenced generations are removed by the next successful save.

Writers of one path take turns: a save holds ``<path>.metadata.lock`` (``flock``, released by the kernel
if the saver dies; the file is removed when the save is done) from creating its data folder until its
cleanup has chosen what to remove, so no save removes another's folder or temp file and every save
that returns leaves a checkpoint that loads (the last one to take the lock wins). A reader that races a
writer of the same path may find the generation it was about to read deleted
(:class:`CheckpointNotFoundError`); reading again gives the new one.

Loading never unpickles objects and never writes into a checkpoint: rows are copied into the
buffer's own storage, built beside the old one and swapped in only once everything has been read and
checked, so a failed load leaves the buffer as it was.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from objectrl_buffer.checkpoint.data import BufferState, read_data, read_manifest, verify_data, write_data_folder
from objectrl_buffer.checkpoint.io import fsync_path, remove_in_background, wait_for_cleanup
from objectrl_buffer.checkpoint.manifest import ExtraValue, Manifest
from objectrl_buffer.checkpoint.metadata import (
    EXTRA_PREFIX,
    METADATA_SUFFIX,
    check_ring,
    checkpoint_base,
    extra_values,
    load_metadata,
    metadata_path,
    read_metadata_file,
    write_metadata_file,
)
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.core.sync import lock_file
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from objectrl_buffer.storage.table import TransitionStorage

__all__ = [
    "METADATA_SUFFIX",
    "Checkpoint",
    "Restored",
    "open_checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "verify_checkpoint",
    "restore_devices",
    "wait_for_cleanup",
]

LOCK_SUFFIX = ".lock"  # <path>.metadata.lock: held by a save from its new data folder to its cleanup
_GENERATION = r"\.data-[0-9a-f]{16}"


# ---------------------------------------------------------------------------------------------- full checkpoints
@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint whose metadata and manifest have been read and validated (data not read yet)."""

    metadata_file: str
    meta: dict[str, Any]
    data_folder: str | None  # None: metadata only (ObjectRL's save)
    manifest: Manifest | None


@dataclass(frozen=True)
class Restored:
    """What a load hands the buffer to adopt; ``storage is None`` means counters only (metadata-only).

    ``extra_arrays`` (new CPU tensors, checksums verified when asked) and ``extra_values`` are what a
    buffer subclass saved in :attr:`BufferState.extra_arrays`/``extra_values``; empty for a checkpoint
    without them. ``source`` names the checkpoint (its data folder, else its metadata file) for errors.
    """

    buffer_size: int
    data_size: int
    pointer: int
    storage: TransitionStorage | None = None
    generator_state: torch.Tensor | None = None  # set_state() on the buffer's generator
    generator_seed: int | None = None  # manual_seed() instead, when the state is for another device type
    shuffle: bool | None = None
    extra_arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_values: dict[str, ExtraValue] = field(default_factory=dict)
    source: str = ""
    phantom: int = 0  # of a full checkpoint: the oldest counted rows hold no data (never sampled)
    num_envs: int = 1


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and validate ``<path>.metadata`` and, for a full checkpoint, its manifest and file sizes.

    Raises:
        CheckpointNotFoundError: the metadata file, the data folder or a file in it is missing.
        CheckpointError: anything else that is wrong (see :func:`load_metadata`, :func:`read_manifest`).
    """
    meta = load_metadata(path)
    source = metadata_path(path)
    if "data_dir" not in meta:
        return Checkpoint(source, meta, None, None)
    folder = os.path.join(os.path.dirname(os.path.abspath(source)), meta["data_dir"])
    manifest = read_manifest(folder, meta["data_manifest_crc32"])
    saved = (manifest.buffer_size, manifest.data_size, manifest.pointer)
    if saved != check_ring(meta, source):
        raise CheckpointError(
            f"'{source}' and '{folder}' disagree on the ring state: {check_ring(meta, source)} vs {saved}"
        )
    return Checkpoint(source, meta, folder, manifest)


def _check_destination(target: str) -> str:
    """The folder ``target`` goes into; raise if it is missing, a file, or ``target`` is a folder."""
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        ancestor = folder
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise CheckpointError(f"cannot save '{target}': '{ancestor}' is a file, expected a folder")
        raise CheckpointNotFoundError(f"cannot save '{target}': the folder '{folder}' does not exist")
    if os.path.isdir(target):
        raise CheckpointError(f"cannot save '{target}': it is a folder, expected a metadata file")
    return folder


def _remove_stale(folder: str, base: str, keep: set[str | None]) -> None:
    """Remove this checkpoint's generation folders not in ``keep`` (in the background) and leftover temp files.

    Called under the writers' lock, with ``keep`` holding the new folder and whatever the metadata names
    when re-read there: no other writer is between its new folder and its metadata then, so the removed
    folders are unreferenced for good. Best effort: the new checkpoint is complete already.
    """
    generation = re.compile(re.escape(base) + _GENERATION)
    temp = re.compile(re.escape(base + METADATA_SUFFIX) + r"\.[A-Za-z0-9_]+\.tmp")
    stale = []
    try:
        for entry in os.scandir(folder):
            if entry.name not in keep and generation.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                stale.append(entry.path)
            elif temp.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
    except OSError:
        pass
    remove_in_background(stale)


@contextmanager
def _writers_lock(target: str) -> Iterator[None]:
    """Hold ``<target>.lock`` (``<path>.metadata.lock``): saves of one path wait for each other.

    The kernel releases the lock when its holder dies, and the holder removes the file when done.
    """
    lock = target + LOCK_SUFFIX
    with ExitStack() as held:
        try:
            held.enter_context(lock_file(lock))
        except OSError as exc:
            raise CheckpointError(f"cannot save '{target}': cannot lock '{lock}': {exc.strerror or exc}") from exc
        yield


def _referenced(target: str) -> str | None:
    try:
        return read_metadata_file(target).get("data_dir")
    except CheckpointError:
        return None


def save_checkpoint(
    path: str | os.PathLike[str], state: BufferState, data: bool = False, progress: bool | None = None
) -> str:
    """Save the counters of ``state`` (and with ``data`` everything else) at ``path``; return the metadata file.

    Raises:
        CheckpointNotFoundError: the folder of ``path`` does not exist.
        CheckpointError: the destination is a file/folder of the wrong kind, is read-only, the disk
            fills up, or the buffer counts rows it does not hold (metadata-only load). The previous
            checkpoint at ``path`` is then intact, and no new files are left behind.
    """
    path = checkpoint_base(path)  # once: the files this save creates must not change its meaning
    target = path + METADATA_SUFFIX
    folder = _check_destination(target)
    base = os.path.basename(target)[: -len(METADATA_SUFFIX)]
    meta: dict[str, Any] = {"buffer_size": state.buffer_size, "data_size": state.data_size, "pointer": state.pointer}
    if data and state.schema is None and state.data_size:
        raise CheckpointError(
            f"cannot save the data of '{target}': the buffer counts {state.data_size} rows but holds none "
            "(its counters came from a metadata-only load); use save(path, data=False)"
        )
    # Writers of one path take turns from the new folder to the cleanup: otherwise one's cleanup removes
    # the folder (or temp file) of another, whose metadata then names nothing.
    with _writers_lock(target):
        name = None
        if data:
            name = f"{base}.data-{secrets.token_hex(8)}"
            generation = os.path.join(folder, name)
            try:
                os.mkdir(generation)
                meta["data_manifest_crc32"] = write_data_folder(generation, state, progress)
                fsync_path(folder)  # the new folder's entry is durable before any metadata names it
            except BaseException as exc:
                shutil.rmtree(generation, ignore_errors=True)
                if isinstance(exc, OSError):
                    raise CheckpointError(
                        f"cannot save the data of '{target}' into '{generation}': {exc.strerror or exc}; "
                        "the previous checkpoint is intact"
                    ) from exc
                raise
            meta["data_dir"] = name
            if state.phantom:
                meta["phantom"] = state.phantom
        else:  # ObjectRL's save: the counters an extra state asks for too (a rate limiter's)
            meta.update({f"{EXTRA_PREFIX}{key}": value for key, value in state.metadata_values.items()})
        try:
            write_metadata_file(target, meta)
        except BaseException:
            if name is not None and _referenced(target) != name:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            raise
        _remove_stale(folder, base, keep={name, _referenced(target)})
    return target


def _layout(schema: Schema | None) -> dict[Any, tuple[torch.Size, torch.dtype]]:
    return {} if schema is None else {f.key: (f.shape, f.dtype) for f in schema.fields}


def load_checkpoint(
    state: BufferState,
    path: str | os.PathLike[str],
    check: Callable[[Restored], None] = lambda restored: None,
    verify: bool = True,
    progress: bool | None = None,
) -> Restored:
    """Validate the checkpoint at ``path`` against the buffer described by ``state``, read it into new
    storage, let ``check`` refuse it (``CheckpointError``), and return it for the buffer to adopt.

    Capacity and schema: a buffer that holds rows only loads a checkpoint of its own ``buffer_size``
    and (for a full checkpoint) its own keys/shapes/dtypes and ``num_envs``; an empty buffer adopts
    whatever was saved. A metadata-only checkpoint keeps the buffer's ``num_envs`` (its counters must
    be whole env steps of it).
    Everything (rows, extra arrays) is read and checked, and ``check`` has accepted it, before this
    returns: the caller adopts a :class:`Restored` that cannot fail (the new storage is closed on failure).

    Raises:
        CheckpointNotFoundError, CheckpointError: see :func:`open_checkpoint`; also a capacity or schema
            that does not fit, a checksum mismatch (when ``verify``), or what ``check`` refuses.
    """
    ckpt = open_checkpoint(path)
    capacity, size, pointer = check_ring(ckpt.meta, ckpt.metadata_file)
    holds_rows = state.schema is not None
    if holds_rows and capacity != state.buffer_size:
        raise CheckpointError(
            f"'{ckpt.metadata_file}' has buffer_size {capacity} but this buffer holds data with capacity "
            f"{state.buffer_size}: reset() it, or use ReplayBuffer.from_checkpoint()"
        )
    manifest = ckpt.manifest
    if manifest is None or ckpt.data_folder is None:
        if capacity % state.num_envs or size % state.num_envs or pointer % state.num_envs:
            raise CheckpointError(
                f"'{ckpt.metadata_file}' has buffer_size={capacity}, data_size={size}, pointer={pointer}: not "
                f"whole env steps of this buffer's num_envs={state.num_envs}"
            )
        restored = Restored(
            capacity,
            size,
            pointer,
            extra_values=extra_values(ckpt.meta),
            source=ckpt.metadata_file,
            num_envs=state.num_envs,
        )
        check(restored)
        return restored
    if holds_rows and manifest.schema is not None and _layout(manifest.schema) != _layout(state.schema):
        raise CheckpointError(
            f"'{ckpt.data_folder}' holds {manifest.schema!r} but this buffer holds data of {state.schema!r}: "
            "reset() it first, or use ReplayBuffer.from_checkpoint()"
        )
    if holds_rows and manifest.num_envs != state.num_envs:
        raise CheckpointError(
            f"'{ckpt.data_folder}' was saved with num_envs={manifest.num_envs} but this buffer holds data of "
            f"num_envs={state.num_envs}: reset() it first, or use ReplayBuffer.from_checkpoint()"
        )
    generator_state = None
    if manifest.generator_device == state.storing_device.type:
        generator_state = torch.frombuffer(bytearray(manifest.generator_state), dtype=torch.uint8)
        try:
            torch.Generator(device=state.storing_device).set_state(generator_state)
        except RuntimeError as exc:
            raise CheckpointError(f"'{ckpt.data_folder}' holds an invalid generator state: {exc}") from None
    seed = None if generator_state is not None else manifest.generator_seed
    storage = None
    try:
        storage = TransitionStorage(capacity, state.storing_device, state.storage_dir)
        schema = manifest.schema
        if schema is not None:
            storage.initialize(
                schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields}, populate=False
            )
            storage.reserve_rows(manifest.data_size, populate=False)  # the loader maps the pages as it copies
        extras = read_data(ckpt.data_folder, manifest, storage.columns, verify, progress)
        restored = Restored(
            capacity,
            size,
            pointer,
            storage,
            generator_state,
            seed,
            manifest.shuffle,
            extra_arrays=extras,
            extra_values=dict(manifest.extra_values),
            source=ckpt.data_folder,
            phantom=ckpt.meta.get("phantom", 0),
            num_envs=manifest.num_envs,
        )
        check(restored)
    except BaseException as exc:
        if storage is not None:
            storage.close()
        if isinstance(exc, (OSError, RuntimeError)) and not isinstance(exc, CheckpointError):
            raise CheckpointError(
                f"cannot load '{ckpt.data_folder}' into new storage on {state.storing_device}: {exc}"
            ) from exc
        raise
    return restored


def verify_checkpoint(path: str | os.PathLike[str], progress: bool | None = None) -> Checkpoint:
    """Re-check everything of the checkpoint at ``path``, every checksum included; return it if intact.

    Raises:
        CheckpointNotFoundError, CheckpointError: what is missing or damaged, naming the file.
    """
    ckpt = open_checkpoint(path)
    if ckpt.manifest is not None and ckpt.data_folder is not None:
        verify_data(ckpt.data_folder, ckpt.manifest, progress)
    return ckpt


def _usable(name: str, what: str, source: str) -> str:
    """``name`` if tensors can be made on that device here, else ``"cpu"`` (with a warning)."""
    try:
        torch.empty(0, device=torch.device(name))
        return name
    except Exception:  # an unavailable backend raises RuntimeError, AssertionError, ...
        warnings.warn(f"'{source}' was saved with {what}={name}, not available here: using cpu", stacklevel=3)
        return "cpu"


def restore_devices(
    path: str | os.PathLike[str], device: torch.device | str | None, storing_device: torch.device | str | None
) -> tuple[Checkpoint, torch.device | str, torch.device | str]:
    """Open and validate the checkpoint at ``path`` for ``from_checkpoint``; return it with the devices a
    new buffer should use: those given, else those recorded at save time when available here, else cpu.

    Raises:
        CheckpointNotFoundError, CheckpointError: see :func:`open_checkpoint`.
    """
    ckpt = open_checkpoint(path)
    saved = ckpt.manifest
    if device is None:
        device = _usable(saved.device, "device", ckpt.metadata_file) if saved else "cpu"
    if storing_device is None:
        storing_device = _usable(saved.storing_device, "storing_device", ckpt.metadata_file) if saved else "cpu"
    return ckpt, device, storing_device
