"""Helpers shared by the test suite (fixtures live in ``conftest.py``): transitions built the way ObjectRL
builds them, buffer snapshots, and the checkpoint tests' rows of every dtype.

Every row's values are a function of its row number or step, so a test can tell exactly which rows a
buffer holds and in which slots.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import signal
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer import ReplayBuffer

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def loaded_script(path: Path, name: str) -> Iterator[ModuleType]:
    """A script (an example, a harness) imported as module ``name``, registered in ``sys.modules`` while in
    use (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


OBS_DIM = 4
ACT_DIM = 2
#: Keys of a transition as ObjectRL's base agent stores it (PPO adds ``PPO_KEYS``).
OBJECTRL_KEYS = ("state", "action", "reward", "next_state", "terminated", "truncated", "step")
PPO_KEYS = ("action_logprob", "value", "next_state_value")


def objectrl_transition(step: int, storing_device: str | torch.device = "cpu", *, ppo: bool = False) -> TensorDict:
    """One transition exactly as ObjectRL's ``agent.generate_transition`` builds it.

    ``state``/``action``/``next_state`` are tensors moved to the storing device, ``reward``/``terminated``/
    ``truncated`` are Python floats, ``step`` a Python int (TensorDict turns them into 0-d tensors).
    Every value is a function of ``step``, so a stored row can be identified by its ``step``.
    """
    state = torch.arange(OBS_DIM, dtype=torch.float32) + step
    data: dict[str, Any] = {
        "state": state.to(storing_device),
        "action": torch.full((ACT_DIM,), step / 10).to(storing_device),
        "reward": float(step) * 0.5,
        "next_state": (state + 1).to(storing_device),
        "terminated": float(step % 7 == 6),
        "truncated": float(False),
        "step": int(step),
    }
    if ppo:
        data["action_logprob"] = torch.tensor(-0.01 * step)
        data["value"] = torch.tensor(0.25 * step)
        data["next_state_value"] = torch.tensor(0.25 * (step + 1))
    return TensorDict(data, batch_size=[])


def objectrl_batch(start: int, n: int, *, ppo: bool = False) -> TensorDict:
    """``n`` transitions with steps ``start .. start+n-1`` as one TensorDict of batch size ``[n]``."""
    rows = [objectrl_transition(start + i, ppo=ppo) for i in range(n)]
    if not rows:
        template = objectrl_transition(0, ppo=ppo)
        return TensorDict({k: v.new_empty((0, *v.shape)) for k, v in template.items()}, batch_size=[0])
    keys = list(rows[0].keys())  # not `in rows[0]`: iterating a TensorDict walks its batch dimension
    return TensorDict({k: torch.stack([r[k] for r in rows]) for k in keys}, batch_size=[n])


def fill(rb: ReplayBuffer, steps: range | list[int], *, ppo: bool = False) -> None:
    """``rb.add`` one ObjectRL transition per step."""
    for step in steps:
        rb.add(objectrl_transition(step, ppo=ppo))


def steps_of(td: TensorDictBase) -> list[int]:
    """The ``step`` values of a sample, as a list (identifies the rows)."""
    return td["step"].tolist()


def assert_td_equal(actual: TensorDictBase, expected: TensorDictBase) -> None:
    """Same batch size, same (nested) keys, bit-identical values and dtypes."""
    assert actual.batch_size == expected.batch_size
    actual_keys = set(actual.keys(include_nested=True, leaves_only=True))
    expected_keys = set(expected.keys(include_nested=True, leaves_only=True))
    assert actual_keys == expected_keys
    for key in expected_keys:
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype, key
        assert torch.equal(a, e), key


def snapshot(rb: ReplayBuffer) -> dict[str, Any]:
    """Everything observable about a buffer, to check that a failed call changed nothing."""
    visible = rb.data_size > 0 and rb.schema is not None
    return {
        "len": len(rb),
        "size": rb.size,
        "pointer": rb.pointer,
        "data_size": rb.data_size,
        "buffer_size": rb.buffer_size,
        "schema": rb.schema,
        "generator": rb.generator.get_state(),
        "all": rb.sample_all() if visible else None,
        "slots": rb.sample_by_index(range(rb.data_size)) if visible else None,
    }


def assert_unchanged(rb: ReplayBuffer, before: dict[str, Any]) -> None:
    after = snapshot(rb)
    for name in ("len", "size", "pointer", "data_size", "buffer_size", "schema"):
        assert after[name] == before[name], name
    assert torch.equal(after["generator"], before["generator"])
    for name in ("all", "slots"):
        if before[name] is None:
            assert after[name] is None
        else:
            assert_td_equal(after[name], before[name])


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- checkpoint tests


# What ObjectRL transitions carry (state/action/next_state float32, reward as a Python float ->
# float32, terminated/truncated bool, step int) plus Atari-style uint8 frames and a float64 value.
SPEC: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "state": ((4,), torch.float32),
    "action": ((2,), torch.float32),
    "reward": ((), torch.float32),
    "next_state": ((4,), torch.float32),
    "terminated": ((), torch.bool),
    "truncated": ((), torch.bool),
    "step": ((), torch.int64),
    "frame": ((3, 5, 5), torch.uint8),
    "value": ((), torch.float64),
}


def rows(first: int, n: int, spec: dict[str, tuple[tuple[int, ...], torch.dtype]] = SPEC) -> dict[str, torch.Tensor]:
    """``n`` transitions numbered ``first .. first+n-1`` (batch-first tensors)."""
    ids = torch.arange(first, first + n, dtype=torch.int64)
    out = {}
    for key, (shape, dtype) in spec.items():
        width = int(torch.Size(shape).numel())
        base = ids.unsqueeze(1) * 1000 + torch.arange(width).unsqueeze(0) + len(key)
        if dtype == torch.bool:
            value = (base % 3) == 0
        elif dtype == torch.uint8:
            value = base % 251
        elif dtype.is_floating_point:
            value = base.to(torch.float64) / 7.0
        else:
            value = base
        out[key] = value.to(dtype).reshape(n, *shape)
    return out


def one_row(i: int) -> dict[str, Any]:
    """Transition ``i`` as ObjectRL's agent builds it: tensors plus Python numbers."""
    r = {k: v[0] for k, v in rows(i, 1).items()}
    return {**r, "reward": float(r["reward"]), "terminated": bool(r["terminated"]), "step": int(r["step"])}


def fill_rows(rb: ReplayBuffer, n: int, first: int = 0) -> None:
    """Add rows ``first .. first+n-1``: single ``add`` calls and batches, mixed (both write paths)."""
    i = first
    while i < first + n:
        if (i // 3) % 2 == 0:
            rb.add(one_row(i))
            i += 1
        else:
            k = min(5, first + n - i)
            rb.add_batch(rows(i, k))
            i += k


def full_snapshot(rb: ReplayBuffer) -> dict[str, Any]:
    """Everything observable without consuming randomness: counters, rows by slot, sample_all order."""
    out: dict[str, Any] = {
        "len": len(rb),
        "pointer": rb.pointer,
        "buffer_size": rb.buffer_size,
        "shuffle": rb.shuffle,
        "schema": repr(rb.schema),
        "generator": rb.generator.get_state().clone(),
    }
    if rb.schema is not None and len(rb):
        out["slots"] = rb.sample_by_index(range(len(rb))).to_dict()
        out["all"] = rb.sample_all().to_dict()
    return out


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Deep equality of snapshots (tensors compared exactly, dtypes included)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a} vs {b}"
        assert torch.equal(a, b), f"{where}: values differ"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def next_draws(rb: ReplayBuffer) -> dict[str, Any]:
    """What the buffer's randomness gives next: three sample_batch calls and one shuffled epoch."""
    out = {f"batch{i}": rb.sample_batch(7).to_dict() for i in range(3)}
    out["epoch"] = [b["index"] for b in rb.create_epoch_iterator(4, shuffle=True)]
    return out


def data_folder(path: str | os.PathLike[str]) -> str:
    """The data folder that ``<path>.metadata`` references."""
    meta = torch.load(os.fspath(path) + ".metadata", weights_only=True)
    return os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), meta["data_dir"])


def signed(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with ``metadata_crc32`` recomputed as the README documents it (crc32 of the other entries
    as JSON, keys sorted, no spaces, ASCII): what a hostile or careless editor of the file would do."""
    rest = {k: v for k, v in meta.items() if k != "metadata_crc32"}
    encoded = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return {**rest, "metadata_crc32": zlib.crc32(encoded)}


def edit_metadata(path: str | os.PathLike[str], change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite ``<path>.metadata`` with ``change`` applied and its own crc32 recomputed (only ``change`` is wrong)."""
    meta_file = os.fspath(path) + ".metadata"
    meta = torch.load(meta_file, weights_only=True)
    change(meta)
    torch.save(signed(meta), meta_file)


def replace_manifest(path: str | os.PathLike[str], payload: bytes) -> None:
    """Write ``payload`` as the manifest and re-record every checksum that covers it."""
    with open(os.path.join(data_folder(path), "manifest.json"), "wb") as f:
        f.write(payload)
    edit_metadata(path, lambda meta: meta.update(data_manifest_crc32=zlib.crc32(payload)))


def edit_manifest(path: str | os.PathLike[str], change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the manifest with ``change`` applied, and re-record its crc32 so only ``change`` is wrong."""
    with open(os.path.join(data_folder(path), "manifest.json")) as f:
        manifest = json.load(f)
    change(manifest)
    replace_manifest(path, json.dumps(manifest).encode())


def tree(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> bytes): to prove that nothing changed on disk."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, folder)] = f.read()
    return out


def version(storage: str, v: int) -> ReplayBuffer:
    """Buffer contents number ``v``: 13 rows for v=0, 19 for v=1 (other rows, other pointer).

    Three columns (float32, bool, int64): every step of a save repeats per column, so three cover the
    first, a middle and the last one with a third of the crash points that all nine keys would take.
    """
    rb = ReplayBuffer("cpu", "cpu", 16, seed=v, shuffle=bool(v), storage_dir=storage)
    rb.add_batch(rows(100 * v, 13 + 6 * v, {k: SPEC[k] for k in ("state", "terminated", "step")}))
    return rb


def forkserver() -> Any:
    """A forkserver context whose server has imported torch and the test modules once: a child costs no import."""
    ctx = multiprocessing.get_context("forkserver")
    preload = [
        "objectrl_buffer",
        "tests.support",
        "tests.stress.kill_during_save",
        "tests.checkpoint.test_crash_safety",
        "tests.checkpoint.test_crash_points",
    ]
    ctx.set_forkserver_preload(preload)
    return ctx


def round_trip_in_fresh_process(
    tmp_path: Any,
    buffers: dict[str, ReplayBuffer],
    *,
    helpers: str,
    snapshot_name: str,
    next_draws_fn: Callable[[Any], Any],
    snapshot_fn: Callable[[Any], Any],
    cls_name: str,
) -> None:
    """Save each buffer with data, rebuild it in a new Python process with ``cls_name.from_checkpoint``
    and assert the child's snapshot and next draws equal the parent's.

    ``helpers`` is the test module the child imports ``next_draws`` and ``snapshot_name`` from.
    """
    import subprocess
    import sys
    import textwrap

    repo = REPO
    cases = {}
    for name, rb in buffers.items():
        path = tmp_path / f"run-{name}"
        rb.save(path, data=True)
        expected = {"snapshot": snapshot_fn(rb)}
        if len(rb):
            expected["draws"] = next_draws_fn(rb)
        torch.save(expected, tmp_path / f"expected-{name}.pt")
        cases[str(path)] = str(tmp_path / f"got-{name}.pt")
    child = textwrap.dedent(
        f"""
        import json, sys, torch
        from {helpers} import next_draws, {snapshot_name} as snapshot
        from objectrl_buffer import {cls_name} as Buffer
        for path, out in json.loads(sys.argv[1]).items():
            rb = Buffer.from_checkpoint(path, storage_dir=sys.argv[2])
            got = {{"snapshot": snapshot(rb)}}
            if len(rb):
                got["draws"] = next_draws(rb)
            torch.save(got, out)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(repo)}
    result = subprocess.run(
        [sys.executable, "-c", child, json.dumps(cases), str(tmp_path / "child-storage")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for name in buffers:
        expected = torch.load(tmp_path / f"expected-{name}.pt", weights_only=False)
        got = torch.load(tmp_path / f"got-{name}.pt", weights_only=False)
        assert_same(got, expected, name)


def save_version_at_once(path: str, storage: str, v: int, barrier: Any) -> None:
    """Child: build version ``v``, wait for every other saver at ``barrier``, then save it with data."""
    from objectrl_buffer.checkpoint.generations import wait_for_cleanup

    rb = version(storage, v)
    barrier.wait()
    rb.save(path, data=True)
    wait_for_cleanup()


def save_and_hang(path: str, storage: str, v: int, flag: str) -> None:
    """Child: save version ``v`` but stop for good once its data folder is written (then get SIGKILLed)."""
    import time

    from objectrl_buffer.checkpoint import generations

    real = generations.write_data_folder

    def write_then_hang(*args: Any, **kwargs: Any) -> int:
        real(*args, **kwargs)
        with open(flag, "w"):
            pass
        time.sleep(600)
        raise AssertionError("not killed")

    generations.write_data_folder = write_then_hang  # type: ignore[assignment]
    version(storage, v).save(path, data=True)


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block takes longer than ``seconds`` (main thread only)."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def saved_wrapped_checkpoint(tmp_path: Path) -> Path:
    """A full checkpoint at ``<tmp>/ck/run`` of a wrapped buffer (capacity 8, 13 rows added, seed 1)."""
    (tmp_path / "ck").mkdir(exist_ok=True)
    rb = ReplayBuffer("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.save(tmp_path / "ck" / "run", data=True)
    rb.close()
    return tmp_path / "ck" / "run"
