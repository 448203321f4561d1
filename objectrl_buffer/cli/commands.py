"""``objectrl-buffer``: look into buffer checkpoints from the shell.

    objectrl-buffer inspect PATH [--json]   capacity, size, pointer, schema, extras, format, creation info;
                                            for another room's checkpoint (a trajectory folder, rank_*
                                            folders, an async buffer file, a task folder) what it is, its
                                            counts and what reads it (:mod:`~objectrl_buffer.cli.kinds`)
    objectrl-buffer verify PATH             re-check every checksum: exit 0 if intact, 1 with the reason
    objectrl-buffer clean [--dry-run] [DIR ...]
                                            remove what killed processes left (storage folders, shared
                                            buffers' and task storages' folders, rate-limiter counter
                                            files; default DIRs: /dev/shm and the temp folder), listing
                                            them with sizes

    objectrl-buffer trajectories sample --load-path P [--num-chunks N --sample-window-size W
                                        --cache-size K --enable-cache]
                                            load an RLinf trajectory folder, sample once, print keys and shapes
    objectrl-buffer trajectories merge --source-path SRC --save-path DST [--move]
                                            merge SRC/rank_* folders into DST (copies unless --move), ranks
                                            in RLinf's order (names as text: rank_10 before rank_2); the
                                            index also goes to RLinf's misspelled trajector_index.json,
                                            the name RLinf's loader reads; a progress bar on a terminal
    objectrl-buffer trajectories split --source-path SRC --save-path DST --split-count N [--move]
                                            the first N trajectories of SRC into DST, renumbered 0..N-1

``PATH`` is what was given to ``ReplayBuffer.save`` (the ``.metadata`` file's name is accepted too).
``inspect`` reads the metadata and the manifest only (and checks file sizes); ``verify`` reads every byte.
Exit codes: 0 fine, 1 the checkpoint is missing or damaged (the reason goes to stderr), 2 bad usage.
``clean`` only removes storage folders whose owner lock no process holds (:mod:`~objectrl_buffer.storage.folders`),
and counter files and shared folders whose creator is gone and that no process maps or holds open
(:mod:`~objectrl_buffer.storage.shm_files`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from objectrl_buffer.errors import CheckpointError, InvalidArgumentError
from objectrl_buffer.storage import folders, placement, shm_files

if TYPE_CHECKING:
    from objectrl_buffer.checkpoint.generations import Checkpoint

# torch (and everything that imports it) is imported inside the commands that read checkpoints: --help,
# --version and clean start in a fraction of a second (tests/cli/test_commands.py checks that torch stays out).

__all__ = ["main", "describe", "version"]


def version() -> str:
    """The installed package's version (its metadata), or ``objectrl_buffer.__version__`` from a source tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("objectrl_buffer")
    except PackageNotFoundError:
        from objectrl_buffer import __version__

        return __version__


def describe(ckpt: Checkpoint, path: str) -> dict[str, Any]:
    """What ``inspect --json`` prints: plain JSON types only."""
    from objectrl_buffer.core.schema import format_key

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
    """``clean``: remove (or with ``dry_run`` list) what killed processes left in ``dirs``: storage folders
    whose owner lock nobody holds (:mod:`~objectrl_buffer.storage.folders`), and shared rate limiters'
    counter files, shared buffers' folders and task storages' temporary folders that no live process uses
    (:mod:`~objectrl_buffer.storage.shm_files`)."""
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:  # checked before anything is removed
        what = ", ".join(f"'{d}'" for d in missing)
        print(f"objectrl-buffer clean: FAILED: no such folder: {what}", file=sys.stderr)
        return 1
    verb = "would remove" if dry_run else "removed"
    total = count = 0
    for parent in dirs or [placement.SHM_DIR, tempfile.gettempdir()]:
        kinds = ((folders.find_orphans, folders.remove), (shm_files.find_orphans, shm_files.remove))
        for find, remove in kinds:
            for orphan in find(parent):
                if not dry_run and not remove(orphan):
                    continue  # taken over meanwhile, or not removable
                owner = f"pid {orphan.pid}, gone" if orphan.pid is not None else "owner gone"
                print(f"{verb} {orphan.path} ({human_bytes(orphan.nbytes)}, {owner})")
                total += orphan.nbytes
                count += 1
    if count:
        print(f"{verb} {count} {'entry' if count == 1 else 'entries'} (folders and files), {human_bytes(total)}")
    else:
        print("nothing to remove: no folder or file of a dead process found")
    return 0


def _trajectory_parser(commands: Any) -> None:
    """``trajectories sample|merge|split``: RLinf's buffer CLI and its merge/split toolkit script."""
    group = commands.add_parser("trajectories", help="RLinf trajectory folders: sample, merge ranks, split")
    actions = group.add_subparsers(dest="action", required=True)
    sample = actions.add_parser("sample", help="load a folder, sample once, print keys and shapes")
    sample.add_argument("--load-path", required=True, help="folder with metadata.json and trajectory_index.json")
    sample.add_argument("--num-chunks", type=int, default=4, help="transitions to sample (default 4)")
    sample.add_argument("--sample-window-size", type=int, default=10, help="from the newest W trajectories (0: all)")
    sample.add_argument("--cache-size", type=int, default=5, help="trajectories kept in the cache")
    sample.add_argument("--enable-cache", action="store_true", help="cache loaded trajectories (RLinf's option)")
    sample.add_argument("--allow-pickle", action="store_true", help="read .pkl trajectory files (runs their code)")
    merge_help = (
        "merge SRC/rank_* folders into DST; the index is written as trajectory_index.json and also under "
        "RLinf's misspelled name trajector_index.json, which RLinf's loader reads"
    )
    for name, text in (("merge", merge_help), ("split", "the first N trajectories into DST")):
        tool = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        source = "folder holding the rank_* folders" if name == "merge" else "trajectory folder to split"
        tool.add_argument("--source-path", default=".", help=f"{source} (default: the current folder)")
        tool.add_argument("--save-path", required=True, help="new or empty folder to write")
        if name == "split":
            tool.add_argument("--split-count", type=int, required=True, help="trajectories to take (N)")
        tool.add_argument("--move", action="store_true", help="remove the source files once DST is complete")
        tool.add_argument("--copy", action="store_true", help="accepted for RLinf's scripts: copying is the default")


def _terminal_progress() -> bool:
    """A progress bar for a copy: on a terminal (stderr, no ``CI`` variable) and with tqdm installed; on a
    terminal without tqdm, a line on stderr says why there is none. Piped or redirected: none."""
    from objectrl_buffer.checkpoint.io import interactive

    if not interactive():
        return False
    if importlib.util.find_spec("tqdm") is None:
        print("(no progress bar: tqdm is not installed; pip install tqdm)", file=sys.stderr)
        return False
    return True


def trajectories(args: argparse.Namespace) -> int:
    """Run ``trajectories ...``; the room is imported here, so ``--help`` stays fast."""
    from objectrl_buffer.core.schema import format_key
    from objectrl_buffer.errors import ReplayBufferError
    from objectrl_buffer.trajectory import TrajectoryReplayBuffer, merge_rank_folders, split_folder

    try:
        if args.action == "sample":
            buffer = TrajectoryReplayBuffer(
                seed=1234,
                enable_cache=args.enable_cache,
                cache_size=args.cache_size,
                sample_window_size=args.sample_window_size,
                allow_pickle=args.allow_pickle,
            )
            try:
                buffer.load_checkpoint(args.load_path)
                batch = buffer.sample(args.num_chunks)
            finally:
                buffer.close()
            held, loaded = len(buffer), buffer.num_added
            window = f"the newest {held} of {loaded}" if held < loaded else f"{held}"
            print(f"[sample] {batch.batch_size[0]} transitions from {window} trajectories")
            for key in batch.keys(include_nested=True, leaves_only=True):
                value = batch.get(key)
                print(f"  {format_key(key)}: {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}")
            return 0
        progress = _terminal_progress()
        if args.action == "merge":
            n = merge_rank_folders(args.source_path, args.save_path, move=args.move, progress=progress)
        else:
            n = split_folder(args.source_path, args.save_path, args.split_count, move=args.move, progress=progress)
    except (ReplayBufferError, OSError) as exc:
        print(f"objectrl-buffer trajectories {args.action}: FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"{'moved' if args.move else 'copied'} {n} trajectories into {args.save_path}")
    if args.action == "merge":
        print(
            "ids: renumbered in (original id, rank) order, ranks sorted by name as text as RLinf's toolkit "
            "does (rank_10 before rank_2), so they are the ids RLinf's merge gives"
        )
        print(
            "index: trajectory_index.json, and the same index as trajector_index.json (RLinf's merge tool's "
            "misspelled name, which RLinf's loader reads: keep both)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``objectrl-buffer`` console script; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="objectrl-buffer",
        description="Inspect and verify objectrl_buffer checkpoints; clean up after killed runs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="print capacity, size, pointer, schema, extras, format and creation info (trajectory folders, "
        "async buffer files and task folders: what they are, their counts, what reads them)",
    )
    inspect.add_argument("path", help="the checkpoint path given to ReplayBuffer.save (or its .metadata file)")
    inspect.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    verify = commands.add_parser("verify", help="re-check every checksum; exit 0 if intact, 1 if not")
    verify.add_argument("path", help="the checkpoint path given to ReplayBuffer.save (or its .metadata file)")
    sweep = commands.add_parser(
        "clean",
        help="remove the storage folders, shared folders and counter files that killed processes left behind",
    )
    sweep.add_argument("dirs", nargs="*", metavar="DIR", help="parent folders to look in (default: /dev/shm, temp)")
    sweep.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    _trajectory_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "trajectories":
        return trajectories(args)
    if args.command == "clean":
        return clean(args.dirs, args.dry_run)
    from objectrl_buffer.checkpoint.generations import open_checkpoint, verify_checkpoint
    from objectrl_buffer.checkpoint.metadata import checkpoint_base
    from objectrl_buffer.cli.kinds import other_kind, print_other_kind

    path = checkpoint_base(args.path)  # run and run.metadata alike, as ReplayBuffer.load takes them
    try:
        other = None if os.path.exists(f"{path}.metadata") else other_kind(args.path)
        if other is not None:  # another room's checkpoint: what it is, its counts, what reads it
            if args.command == "verify":
                print(
                    f"objectrl-buffer verify: FAILED: '{args.path}' is {other['what']}, not a ReplayBuffer "
                    f"checkpoint; see objectrl-buffer inspect {args.path}",
                    file=sys.stderr,
                )
                return 1
            if args.json:
                print(json.dumps({"path": args.path, **other}, indent=1))
            else:
                print_other_kind(args.path, other)
            return 0
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
