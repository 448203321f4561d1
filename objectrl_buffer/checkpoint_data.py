"""The data folder of a full checkpoint: one raw file per column, a JSON manifest, crc32 checksums.

Layout of ``<path>.data-<16 hex digits>/`` (data format version 1)::

    000-state.bin      column 0: the rows of storage slots 0 .. data_size-1, C order, native byte order
    001-action.bin     (recorded in the manifest, little-endian on every platform we know), no header
    ...
    manifest.json      written last: what the folder holds (see :mod:`~objectrl_buffer.checkpoint_manifest`)

Rows are stored in **slot order** (file row ``i`` is storage slot ``i``), so a load puts every row back
in its slot, ``pointer`` needs no remapping, and the restored generator draws the same slots as the
original would. Slots ``>= data_size`` hold nothing and are not written.

No pickle anywhere: the manifest is JSON, the columns are raw bytes, the generator state is base64 in
the manifest. Checksums are zlib crc32 (per file; the manifest's own crc32 lives in ``<path>.metadata``).
crc32 runs at ~2.3 GB/s on a 2-core VM against ~0.7 GB/s for blake2b and ~1.1 GB/s for sha256, which
keeps a save within ~1.5x of a raw write + fsync; it detects corruption, it is not tamper-proofing.

Memory: columns are written from and read into the storage in slices of :data:`CHUNK_BYTES` (64 MiB),
so saving or loading a buffer of many GB needs at most two chunks of extra RAM (none for CPU storage,
whose memmap slices go to ``os.write``/``readinto`` directly; storage on an accelerator is staged
through host chunks).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from objectrl_buffer.checkpoint_io import Crc32, Progress, fsync_path, progress_bar, readinto_exact, write_all
from objectrl_buffer.checkpoint_manifest import (
    MANIFEST,
    Column,
    Manifest,
    column_file_name,
    manifest_bytes,
    parse_manifest,
)
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from objectrl_buffer.schema import Key, Schema, format_key

__all__ = ["CHUNK_BYTES", "BufferState", "write_data_folder", "read_manifest", "read_columns", "verify_columns"]

CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class BufferState:
    """What a buffer hands over to be saved (references, nothing copied).

    ``columns`` maps each key of ``schema`` to its storage tensor ``[buffer_size, *shape]`` on
    ``storing_device``; only its first ``data_size`` rows are saved.
    """

    buffer_size: int
    data_size: int
    pointer: int
    schema: Schema | None
    columns: Mapping[Key, torch.Tensor]
    generator: torch.Generator
    shuffle: bool
    device: torch.device
    storing_device: torch.device
    storage_dir: str | os.PathLike[str] | None


# ---------------------------------------------------------------------------------------------- helpers
def _byte_view(column: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of a storage column as a flat uint8 view (no copy; any dtype, any device)."""
    head = column[:rows]
    if not head.is_contiguous():
        raise CheckpointError(f"storage column of shape {tuple(column.shape)} is not contiguous")
    return head.reshape(-1).view(torch.uint8)


# ---------------------------------------------------------------------------------------------- writing
def write_data_folder(folder: str, state: BufferState, progress: bool | None = None) -> int:
    """Write the columns and the manifest of ``state`` into the empty, existing ``folder``; fsync all.

    Columns first, the manifest last (it records their sizes and crc32s), then the folder itself. Each
    column's fsync runs on a worker while the next column is written, and the checksums on another
    (see :mod:`~objectrl_buffer.checkpoint_io`). Returns the crc32 of the manifest bytes (the metadata
    file records it). ``OSError`` propagates: the caller names the checkpoint and removes the folder.
    """
    rows = state.data_size
    fields = state.schema.fields if state.schema is not None and rows else ()
    written: list[tuple[Column, Crc32]] = []
    fds: list[int] = []
    staging: torch.Tensor | None = None
    try:
        with (
            ThreadPoolExecutor(1, thread_name_prefix="objectrl_buffer-crc") as crc_pool,
            ThreadPoolExecutor(4, thread_name_prefix="objectrl_buffer-fsync") as sync_pool,
            progress_bar(rows * sum(f.row_bytes for f in fields), f"saving {folder}", progress) as bar,
        ):
            syncs = []
            for index, field in enumerate(fields):
                name = column_file_name(index, field.key)
                flat = _byte_view(state.columns[field.key], rows)
                crc = Crc32(crc_pool)
                fds.append(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                for start in range(0, flat.numel(), CHUNK_BYTES):
                    chunk = flat[start : start + CHUNK_BYTES]
                    on_host = chunk.device.type == "cpu"
                    if not on_host:  # one host staging chunk, reused: wait for its checksum below
                        if staging is None:
                            largest = max(rows * f.row_bytes for f in fields)
                            staging = torch.empty(min(CHUNK_BYTES, largest), dtype=torch.uint8)
                        chunk = staging[: chunk.numel()].copy_(chunk)
                    view = chunk.numpy().data
                    summed = crc.add(view)
                    write_all(fds[-1], view)
                    if not on_host:
                        summed.result()
                    bar.update(len(view))
                syncs.append(sync_pool.submit(os.fsync, fds[-1]))
                written.append((Column(field, name, flat.numel(), 0), crc))
            for sync in syncs:
                sync.result()
            columns = [Column(c.field, c.file, c.nbytes, crc.value()) for c, crc in written]
    finally:
        for fd in fds:
            os.close(fd)
    ring = (state.buffer_size, rows, state.pointer)
    payload = manifest_bytes(columns, ring, state.shuffle, state.generator, state.device, state.storing_device)
    fd = os.open(os.path.join(folder, MANIFEST), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, memoryview(payload))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(folder)
    return zlib.crc32(payload)


# ---------------------------------------------------------------------------------------------- reading
def read_manifest(folder: str, expected_crc32: int | None) -> Manifest:
    """Read and validate ``folder/manifest.json`` (and that every column file exists with its size).

    Raises:
        CheckpointNotFoundError: the folder or the manifest does not exist.
        CheckpointError: the folder is a file, the manifest's crc32 differs from ``expected_crc32``, it is
            not valid JSON or misses fields, its data format version is newer than this library reads,
            it was written on a machine of the other byte order, or a column file is missing, not a
            file, or of the wrong size (truncated).
    """
    if not os.path.lexists(folder):
        raise CheckpointNotFoundError(f"the checkpoint's data folder '{folder}' does not exist")
    if not os.path.isdir(folder):
        raise CheckpointError(f"'{folder}' is a file, expected the checkpoint's data folder")
    where = os.path.join(folder, MANIFEST)
    try:
        with open(where, "rb") as f:
            payload = f.read()
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"the data folder '{folder}' has no {MANIFEST}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read '{where}': {exc.strerror or exc}") from exc
    if expected_crc32 is not None and zlib.crc32(payload) != expected_crc32:
        raise CheckpointError(f"'{where}' is corrupted: its crc32 differs from the one recorded in the metadata")
    manifest = parse_manifest(payload, where)
    for column in manifest.columns:
        path = os.path.join(folder, column.file)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"column file '{path}' of '{format_key(column.field.key)}' is missing"
            ) from None
        if not os.path.isfile(path):
            raise CheckpointError(f"'{path}' is a folder, expected a column file")
        if size != column.nbytes:
            raise CheckpointError(
                f"'{path}' has {size} bytes, its manifest records {column.nbytes}: the file is truncated or damaged"
            )
    return manifest


def _copy_columns(
    folder: str, manifest: Manifest, targets: Mapping[Key, torch.Tensor] | None, verify: bool, bar: Progress
) -> None:
    """Stream every column file in chunks: into ``targets`` (storage columns) when given; check crc32s if ``verify``.

    CPU targets are read straight into (no intermediate copy); otherwise through two alternating host
    chunks, so the checksum of one chunk runs while the next is read.
    """
    scratch: list[torch.Tensor] = []
    pending: list[Future[None] | None] = [None, None]
    with ThreadPoolExecutor(1, thread_name_prefix="objectrl_buffer-crc") as crc_pool:
        for column in manifest.columns:
            path = os.path.join(folder, column.file)
            flat = _byte_view(targets[column.field.key], manifest.data_size) if targets is not None else None
            direct = flat is not None and flat.device.type == "cpu"
            if not direct and not scratch and column.nbytes:
                size = min(CHUNK_BYTES, max(c.nbytes for c in manifest.columns))
                scratch = [torch.empty(size, dtype=torch.uint8) for _ in range(2)]
            crc = Crc32(crc_pool)
            try:
                with open(path, "rb", buffering=0) as f:
                    for i, start in enumerate(range(0, column.nbytes, CHUNK_BYTES)):
                        n = min(CHUNK_BYTES, column.nbytes - start)
                        if direct and flat is not None:
                            chunk = flat[start : start + n]
                        else:
                            previous = pending[i % 2]
                            if previous is not None:
                                previous.result()  # that host chunk's checksum is done: reuse it
                            chunk = scratch[i % 2][:n]
                        view = chunk.numpy().data
                        readinto_exact(f, view, path)
                        if verify:
                            pending[i % 2] = crc.add(view)
                        if flat is not None and not direct:
                            flat[start : start + n].copy_(chunk)
                        bar.update(n)
            except OSError as exc:
                raise CheckpointError(f"cannot read '{path}': {exc.strerror or exc}") from exc
            if verify and crc.value() != column.crc32:
                raise CheckpointError(
                    f"checksum mismatch in '{path}' (crc32 {crc.value():08x}, manifest records "
                    f"{column.crc32:08x}): the checkpoint is corrupted"
                )
            pending = [None, None]


def read_columns(
    folder: str,
    manifest: Manifest,
    columns: Mapping[Key, torch.Tensor],
    verify: bool = True,
    progress: bool | None = None,
) -> None:
    """Copy the rows of every column file into ``columns`` (storage tensors ``[capacity, *shape]``, any device).

    Reads in chunks straight into the storage (CPU) or through two host chunks (other devices); the
    checkpoint files are only read, never mapped. Raises :class:`CheckpointError` on a
    checksum mismatch (when ``verify``) or a read error; ``columns`` may then hold partial data.
    """
    with progress_bar(manifest.nbytes, f"loading {folder}", progress) as bar:
        _copy_columns(folder, manifest, columns, verify, bar)


def verify_columns(folder: str, manifest: Manifest, progress: bool | None = None) -> None:
    """Re-check the crc32 of every column file (two chunks of RAM); raise CheckpointError if one differs."""
    with progress_bar(manifest.nbytes, f"verifying {folder}", progress) as bar:
        _copy_columns(folder, manifest, None, True, bar)
