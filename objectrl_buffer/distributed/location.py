"""Where a remote buffer's checkpoint cuts live: a local folder, or shared or object storage through fsspec.

A :class:`Location` is a root (``checkpoint_path``: a local path, ``file://...``, or any URI fsspec opens,
e.g. ``s3://bucket/run``, ``gs://...``, ``abfs://...`` with the matching fsspec package installed) and the few
operations :mod:`.cut`, the shards and the coordinator need: read and write small files, list, remove, and
move a shard's saved folder to and from the location.

* A **local** location (a plain path or ``file://``: fsspec's ``LocalFileSystem``) is used in place, with no
  copying: small files are replaced with :func:`~objectrl_buffer.checkpoint.io.atomic_write` (temp file,
  fsync, ``os.replace``), a shard saves straight into the generation folder. On several nodes it must be a
  folder every node mounts (NFS, a cluster file system): :func:`check` refuses one that is not.
* A **non-local** location: a shard saves into a local temp folder, then uploads it
  (``fs.put(..., recursive=True)``); a restarted shard downloads its generation (``fs.get``) before loading.
  Small files (the manifest, the journals) are written with one ``fs.pipe_file`` each. The manifest is the
  commit point of a cut: this relies on a single-object PUT being atomic (S3, GCS and Azure Blob never show a
  partly written object: a reader sees the old manifest or the new one). A journal on such a store is
  rewritten whole at each write (:class:`Journal`): it holds only the writes since the last cut.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem

from objectrl_buffer.checkpoint.io import atomic_write
from objectrl_buffer.errors import CheckpointError

__all__ = ["Journal", "Location", "PROBE_PREFIX", "as_location", "new_token", "probe"]

#: Name prefix of the launch check's probe files (:func:`probe`).
PROBE_PREFIX = ".probe-"


class Location:
    """The root ``uri`` of a remote buffer's checkpoints (picklable: it travels to the actors as its URI).

    Raises:
        CheckpointError: fsspec cannot open ``uri`` (unknown protocol, missing package); named.
    """

    def __init__(self, uri: str) -> None:
        self.uri = str(uri)
        try:
            fs, path = fsspec.core.url_to_fs(self.uri)
        except (ValueError, ImportError) as exc:
            raise CheckpointError(f"checkpoint_path {self.uri!r}: fsspec cannot open it ({exc})") from None
        self.fs: Any = fs
        #: a local folder used in place (``LocalFileSystem`` and ``file``/``local`` protocol)
        self.local = type(fs) is LocalFileSystem
        self.root: str = os.path.abspath(path) if self.local else str(path).rstrip("/")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Location, (self.uri,))

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def path(self, *names: str) -> str:
        """The path of ``names`` under the root (a local path when :attr:`local`, else the filesystem's)."""
        return os.path.join(self.root, *names) if self.local else "/".join([self.root, *names])

    def makedirs(self, *names: str) -> None:
        """Make the folder ``names`` (the root itself when none); object stores have no folders to make.

        Raises:
            OSError: as the filesystem raises it (a file in the way: ``FileExistsError``).
        """
        self.fs.makedirs(self.path(*names), exist_ok=True)

    def read_bytes(self, name: str, limit: int = 1 << 20) -> bytes | None:
        """The bytes of the small file ``name`` (at most ``limit``), or ``None`` when there is none."""
        try:
            with self.fs.open(self.path(name), "rb") as f:
                data: bytes = f.read(limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise CheckpointError(f"'{self.path(name)}' is larger than {limit} bytes")
        return data

    def write_bytes(self, name: str, data: bytes, durable: bool = True) -> None:
        """Replace the file ``name`` with ``data`` atomically (see the module docs for what that rests on)."""
        if self.local:

            def write(f: BinaryIO) -> None:
                f.write(data)

            atomic_write(self.path(name), write, durable=durable)
            return
        try:
            self.fs.pipe_file(self.path(name), data)
        except OSError as exc:
            raise CheckpointError(f"cannot write '{self.uri}/{name}': {exc}") from None

    def listdir(self) -> list[str]:
        """The names right under the root (none when it does not exist)."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]

    def remove(self, name: str) -> None:
        """Remove the file or folder ``name`` (nothing when it is gone already; errors are ignored)."""
        if self.local:
            target = self.path(name)
            if os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
            elif os.path.lexists(target):
                os.unlink(target)
            return
        with suppress(OSError):  # FileNotFoundError too: gone already
            self.fs.rm(self.path(name), recursive=True)

    @contextmanager
    def saving(self, name: str) -> Iterator[str]:
        """A local path to ``save`` the folder ``name`` to; uploaded when the block ends without error."""
        if self.local:
            yield self.path(name)
            return
        with tempfile.TemporaryDirectory(prefix="objectrl-cut-") as tmp:
            local = os.path.join(tmp, os.path.basename(name))
            yield local
            parent = self.path(*name.split("/")[:-1])
            try:
                self.fs.makedirs(parent, exist_ok=True)
                for entry in os.listdir(tmp):  # the save path may be a file and a folder beside it
                    source = os.path.join(tmp, entry)
                    self.fs.put(source, f"{parent}/{entry}", recursive=os.path.isdir(source))
            except OSError as exc:
                raise CheckpointError(f"cannot upload '{name}' to {self.uri!r}: {exc}") from None

    @contextmanager
    def loading(self, name: str) -> Iterator[str]:
        """A local path to ``load`` the saved ``name`` from (downloaded first when the location is not local)."""
        if self.local:
            yield self.path(name)
            return
        with tempfile.TemporaryDirectory(prefix="objectrl-cut-") as tmp:
            parent, base = self.path(*name.split("/")[:-1]), os.path.basename(name)
            try:
                for entry in self.fs.ls(parent, detail=False):
                    entry_name = str(entry).rstrip("/").rsplit("/", 1)[-1]
                    if entry_name == base or entry_name.startswith(base + "."):
                        source = f"{parent}/{entry_name}"
                        self.fs.get(source, os.path.join(tmp, entry_name), recursive=self.fs.isdir(source))
            except OSError as exc:
                raise CheckpointError(f"cannot download '{name}' from {self.uri!r}: {exc}") from None
            yield os.path.join(tmp, base)


class Journal:
    """A shard's journal at ``location``/``name``: appended line by line (``fresh``: start it empty).

    Local: a file opened for appending, line-buffered (a line survives the death of the process). Not local:
    the lines are kept here and the whole file is written again after each line (object stores cannot
    append), so the journal costs one small upload per write.
    """

    def __init__(self, location: Location, name: str, fresh: bool) -> None:
        self.location, self.name = location, name
        self.file: Any = None
        self.lines: list[str] = []
        if location.local:
            self.file = open(location.path(name), "w" if fresh else "a", buffering=1)  # noqa: SIM115
        elif not fresh:
            self.lines = (location.read_bytes(name, 1 << 30) or b"").decode().splitlines(keepends=True)
            self.lines = [line for line in self.lines if line.endswith("\n")]
        else:
            location.write_bytes(name, b"")

    def write(self, line: str) -> None:
        if self.file is not None:
            self.file.write(line)
            return
        self.lines.append(line)
        self.location.write_bytes(self.name, "".join(self.lines).encode())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def as_location(root: Location | str) -> Location:
    """``root`` as a :class:`Location` (a path or URI is opened)."""
    return root if isinstance(root, Location) else Location(root)


def probe(
    location: Location, write: tuple[str, str] | None, read: dict[str, str], cleanup: tuple[str, ...] = ()
) -> list[str]:
    """One step of the launch check: write the probe file ``write = (name, token)``, then read each of
    ``read`` (``{name: token expected}``), then remove the files ``cleanup``; what went wrong, one sentence
    each (none: all seen)."""
    problems = []
    if write is not None:
        try:
            location.makedirs()
            location.write_bytes(write[0], write[1].encode(), durable=False)
        except (CheckpointError, OSError) as exc:
            problems.append(f"cannot write {write[0]!r} ({exc})")
    for name, token in read.items():
        try:
            got = location.read_bytes(name)
        except (CheckpointError, OSError) as exc:
            got, problems = None, [*problems, f"cannot read {name!r} ({exc})"]
            continue
        if got is None:
            problems.append(f"does not see {name!r}")
        elif got.decode(errors="replace") != token:
            problems.append(f"sees another {name!r} (not the one just written)")
    for name in cleanup:
        location.remove(name)
    return problems


def check(uri: str, coordinator: Any, shards: list[Any]) -> None:
    """The launch check: every shard and the coordinator write and read the same location ``uri``.

    The coordinator writes a probe file with a random token, every shard reads it and writes its own, the
    coordinator reads them all (and removes them). Ray actor handles; blocks until all answered.

    Raises:
        CheckpointError: an actor could not write or read the location (the message names the location, the
            shard or coordinator and its node).
    """
    import ray

    token = new_token()
    mine = f"{PROBE_PREFIX}{token[:12]}-coordinator"
    theirs = {f"{PROBE_PREFIX}{token[:12]}-shard-{i}": f"{token}-{i}" for i in range(len(shards))}
    problems: list[str] = []

    def saw(who: str, node: str, found: list[str]) -> None:
        problems.extend(f"{who} (node {node}) {problem}" for problem in found)

    saw("the coordinator", *ray.get(coordinator.probe.remote((mine, token), {})))
    steps = zip(shards, theirs.items(), strict=True)
    answers = ray.get([shard.probe.remote(step, {mine: token}) for shard, step in steps])
    for i, answer in enumerate(answers):
        saw(f"shard {i}", *answer)
    saw("the coordinator", *ray.get(coordinator.probe.remote(None, theirs, (mine, *theirs))))
    if problems:
        raise CheckpointError(
            f"checkpoint_path {uri!r} is not one location every shard and the coordinator can write and read "
            f"(use storage every node sees: a shared file system or an object store): {'; '.join(problems)}"
        )


def new_token() -> str:
    """A random token for a probe file."""
    return secrets.token_hex(16)
