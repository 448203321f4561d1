"""What ``objectrl-buffer inspect`` says about a path that is not a ``ReplayBuffer`` checkpoint: the other
rooms' checkpoints (an RLinf trajectory folder, a folder of ``rank_*`` trajectory folders, an
``AsyncSequenceBuffer`` file, a task buffer folder), what each is, its counts, and the command or method
that reads it. Each is recognised by its own marker (file names, a magic line, a manifest's format)."""

from __future__ import annotations

import json
import os
from typing import Any

from objectrl_buffer.errors import CheckpointError

__all__ = ["other_kind", "print_other_kind"]


def _trajectory_folder(path: str) -> dict[str, Any]:
    from objectrl_buffer.trajectory import files

    folder = files.read_folder(path)
    index = files.INDEX if os.path.exists(os.path.join(path, files.INDEX)) else files.LEGACY_INDEX
    return {
        "kind": "trajectory folder",
        "what": "an RLinf trajectory buffer folder (TrajectoryReplayBuffer.save_checkpoint or RLinf's buffer)",
        "trajectories": len(folder.entries),
        "transitions": sum(e.num_samples for e in folder.entries),
        "format": folder.fmt,
        "index": index,
        "seed": folder.seed,
        "use": f"objectrl-buffer trajectories sample --load-path {path}; TrajectoryReplayBuffer.load_checkpoint",
    }


def _rank_folders(path: str, ranks: list[str]) -> dict[str, Any]:
    return {
        "kind": "rank folders",
        "what": "per-rank RLinf trajectory folders (one rank_* folder per training process)",
        "ranks": len(ranks),
        "use": f"objectrl-buffer trajectories merge --source-path {path} --save-path DST; or inspect one rank_* folder",
    }


def _async_file(path: str) -> dict[str, Any]:
    from objectrl_buffer.async_buffer.persist import load_file

    header = load_file(path)["header"]  # every checksum checked
    consumers = [c[0] if isinstance(c, list) and c else c for c in header.get("consumers", [])]
    return {
        "kind": "async buffer checkpoint",
        "what": "an AsyncSequenceBuffer checkpoint (AsyncSequenceBuffer.save), checksums intact",
        "entries": header.get("size"),
        "max_size": header.get("max_size"),
        "consumers": consumers,
        "keys": [k[0] for k in header.get("keys", [])],
        "use": "AsyncSequenceBuffer(consumers, max_size).load(PATH)",
    }


def _task_folder(path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "task buffer checkpoint",
        "what": "a TaskReplayBuffer checkpoint folder (TaskReplayBuffer.save)",
        "rows": manifest.get("rows"),
        "max_capacity": manifest.get("max_capacity"),
        "use": "TaskReplayBuffer(...).load(PATH)",
    }


def other_kind(path: str) -> dict[str, Any] | None:
    """What ``path`` is when it is another room's checkpoint (a dict for ``inspect``), else ``None``.

    Raises:
        CheckpointError: it is one, but damaged (the message names the file).
    """
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if "metadata.json" in names and names & {"trajectory_index.json", "trajector_index.json"}:
            return _trajectory_folder(path)
        if "manifest.json" in names:
            from objectrl_buffer.tasks.persist import FORMAT

            try:
                with open(os.path.join(path, "manifest.json"), "rb") as f:
                    manifest = json.loads(f.read(1 << 20))
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"'{path}/manifest.json' cannot be read: {exc}") from None
            if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
                return _task_folder(path, manifest)
        ranks = sorted(n for n in names if n.startswith("rank_") and os.path.isdir(os.path.join(path, n)))
        if ranks:
            return _rank_folders(path, ranks)
        return None
    if os.path.isfile(path):
        from objectrl_buffer.async_buffer.persist import MAGIC

        with open(path, "rb") as f:
            if f.read(len(MAGIC)) == MAGIC:
                return _async_file(path)
    return None


def print_other_kind(path: str, info: dict[str, Any]) -> None:
    """``inspect``'s human-readable lines for :func:`other_kind`'s answer."""
    line = "{:<12}{}".format
    print(line("path", path))
    print(line("kind", info["what"]))
    print(line("not", "a ReplayBuffer checkpoint (what ReplayBuffer.save writes)"))
    for key, value in info.items():
        if key not in ("kind", "what", "use"):
            print(line(key, ", ".join(map(str, value)) if isinstance(value, list) else value))
    print(line("read with", info["use"]))
