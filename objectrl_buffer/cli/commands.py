"""``objectrl-buffer``: look into buffer checkpoints from the shell.

    objectrl-buffer inspect PATH [--json]   capacity, size, pointer, schema, extras, format, creation info
    objectrl-buffer verify PATH             re-check every checksum: exit 0 if intact, 1 with the reason
    objectrl-buffer clean [--dry-run] [DIR ...]
                                            remove storage folders left by killed processes (default
                                            DIRs: /dev/shm and the temp folder), listing them with sizes

``PATH`` is what was given to ``ReplayBuffer.save`` (the ``.metadata`` file's name is accepted too).
``inspect`` reads the metadata and the manifest only (and checks file sizes); ``verify`` reads every byte.
Exit codes: 0 fine, 1 the checkpoint is missing or damaged (the reason goes to stderr), 2 bad usage.
``clean`` only removes folders whose owner lock no process holds (:mod:`~objectrl_buffer.storage.folders`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from objectrl_buffer.checkpoint.generations import METADATA_SUFFIX, Checkpoint, open_checkpoint, verify_checkpoint
from objectrl_buffer.core.schema import format_key
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError
from objectrl_buffer.storage import folders, placement

__all__ = ["main", "describe"]


def _resolve(path: str) -> str:
    """Accept ``run`` and ``run.metadata`` alike."""
    if path.endswith(METADATA_SUFFIX) and not os.path.exists(path + METADATA_SUFFIX):
        return path[: -len(METADATA_SUFFIX)]
    return path


def describe(ckpt: Checkpoint, path: str) -> dict[str, Any]:
    """What ``inspect --json`` prints: plain JSON types only."""
    meta, manifest = ckpt.meta, ckpt.manifest
    info: dict[str, Any] = {
        "path": path,
        "metadata_file": ckpt.metadata_file,
        "format": meta.get("format", "objectrl (no format key)"),
        "format_version": meta.get("format_version", 0),
        "capacity": meta["buffer_size"],
        "size": meta["data_size"],
        "pointer": meta["pointer"],
        "data_folder": ckpt.data_folder,
    }
    if manifest is None:
        return info
    schema: list[dict[str, Any]] = [
        {
            "key": format_key(c.field.key),
            "shape": list(c.field.shape),
            "dtype": str(c.field.dtype).removeprefix("torch."),
            "row_bytes": c.field.row_bytes,
            "bytes": c.nbytes,
            "file": c.file,
            "crc32": f"{c.crc32:08x}",
        }
        for c in manifest.columns
    ]
    info.update(
        data_format_version=manifest.format_version,
        schema=schema,
        row_bytes=sum(c.field.row_bytes for c in manifest.columns),
        data_bytes=manifest.nbytes,
        shuffle=manifest.shuffle,
        generator={"device": manifest.generator_device, "initial_seed": manifest.generator_seed},
        devices={"device": manifest.device, "storing_device": manifest.storing_device},
        created=manifest.created,
        extra_arrays=[
            {
                "name": a.name,
                "shape": list(a.shape),
                "dtype": str(a.dtype).removeprefix("torch."),
                "bytes": a.nbytes,
                "file": a.file,
                "crc32": f"{a.crc32:08x}",
            }
            for a in manifest.extra_arrays
        ],
        extra_values=dict(manifest.extra_values),
    )
    return info


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError


def _print_human(info: dict[str, Any]) -> None:
    line = "{:<12}{}".format
    print(line("checkpoint", info["path"]))
    print(line("metadata", f"{info['metadata_file']} (format {info['format']} v{info['format_version']})"))
    print(line("capacity", info["capacity"]))
    print(line("size", info["size"]))
    print(line("pointer", info["pointer"]))
    if info["data_folder"] is None:
        print(line("data", "none: a metadata-only checkpoint (counters, no rows)"))
        return
    size = human_bytes(info["data_bytes"])
    print(line("data", f"{info['data_folder']} (format v{info['data_format_version']}, {size})"))
    print(line("schema", f"{len(info['schema'])} keys, {info['row_bytes']} bytes per row"))
    rows: list[tuple[str, ...]] = [("key", "shape", "dtype", "bytes/row", "bytes")]
    rows += [
        (c["key"], str(tuple(c["shape"])), c["dtype"], str(c["row_bytes"]), str(c["bytes"])) for c in info["schema"]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print(
            "  "
            + "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
        )
    gen = info["generator"]
    print(
        line(
            "sampling", f"shuffle={info['shuffle']}, generator on {gen['device']} (initial seed {gen['initial_seed']})"
        )
    )
    print(line("devices", ", ".join(f"{k}={v}" for k, v in info["devices"].items())))
    for extra in info["extra_arrays"]:
        shape, size = tuple(extra["shape"]), human_bytes(extra["bytes"])
        print(line("extra", f"{extra['name']}: {extra['dtype']} {shape}, {size} in {extra['file']}"))
    if info["extra_values"]:
        print(line("extra", ", ".join(f"{k}={v!r}" for k, v in info["extra_values"].items())))
    created = dict(info["created"])
    when, host = created.pop("time", "?"), created.pop("host", "?")
    library = f"{created.pop('library', '?')} {created.pop('library_version', '')}".strip()
    versions = ", ".join(f"{k} {v}" for k, v in created.items())
    print(line("created", f"{when} on {host} by {library} ({versions})"))


def clean(dirs: list[str], dry_run: bool) -> int:
    """``clean``: remove (or with ``dry_run`` list) the folders in ``dirs`` that killed processes left behind."""
    verb = "would remove" if dry_run else "removed"
    total = count = 0
    for parent in dirs or [placement.SHM_DIR, tempfile.gettempdir()]:
        for orphan in folders.find_orphans(parent):
            if not dry_run and not folders.remove(orphan):
                continue  # taken over meanwhile, or not removable
            owner = f"pid {orphan.pid}, gone" if orphan.pid is not None else "owner gone"
            print(f"{verb} {orphan.path} ({human_bytes(orphan.nbytes)}, {owner})")
            total += orphan.nbytes
            count += 1
    if count:
        print(f"{verb} {count} folder{'s' * (count != 1)}, {human_bytes(total)}")
    else:
        print("nothing to remove: no folder of a dead process found")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``objectrl-buffer`` console script; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="objectrl-buffer",
        description="Inspect and verify objectrl_buffer checkpoints; clean up after killed runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="print capacity, size, pointer, schema, extras, format and creation info"
    )
    inspect.add_argument("path", help="the checkpoint path given to ReplayBuffer.save (or its .metadata file)")
    inspect.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    verify = commands.add_parser("verify", help="re-check every checksum; exit 0 if intact, 1 if not")
    verify.add_argument("path", help="the checkpoint path given to ReplayBuffer.save (or its .metadata file)")
    sweep = commands.add_parser("clean", help="remove storage folders that killed processes left behind")
    sweep.add_argument("dirs", nargs="*", metavar="DIR", help="parent folders to look in (default: /dev/shm, temp)")
    sweep.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    args = parser.parse_args(argv)
    if args.command == "clean":
        return clean(args.dirs, args.dry_run)
    path = _resolve(args.path)
    try:
        if args.command == "inspect":
            info = describe(open_checkpoint(path), path)
            if args.json:
                print(json.dumps(info, indent=1))
            else:
                _print_human(info)
            return 0
        ckpt = verify_checkpoint(path)
    except (CheckpointError, InvalidArgumentError) as exc:  # a damaged checkpoint, or a path that names none
        print(f"objectrl-buffer {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    if ckpt.manifest is None:
        print(f"OK: {ckpt.metadata_file} is a valid metadata-only checkpoint (no data to check)")
    else:
        print(
            f"OK: {path}: {ckpt.manifest.data_size} rows, {len(ckpt.manifest.columns)} column files"
            + (f" + {len(ckpt.manifest.extra_arrays)} extra" if ckpt.manifest.extra_arrays else "")
            + f", {human_bytes(ckpt.manifest.nbytes + ckpt.manifest.extra_nbytes)}, every crc32 matches"
        )
    return 0
