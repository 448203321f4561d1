"""The workloads of ``bench.py``, run inside one child process per (library, workload).

Data is generated from fixed seeds, so every library gets the same transitions. Times are medians of
per-block means (``block`` calls per block) after ``warmup`` untimed calls; q1/q3 of the blocks are kept
to show the spread.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from peers import Batch, Peer, Spec, Unsupported

MUJOCO: Spec = {
    "state": ((17,), torch.float32),
    "action": ((6,), torch.float32),
    "reward": ((), torch.float32),
    "next_state": ((17,), torch.float32),
    "terminated": ((), torch.float32),
    "truncated": ((), torch.float32),
    "step": ((), torch.int64),
}
ATARI: Spec = {
    "state": ((4, 84, 84), torch.uint8),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "next_state": ((4, 84, 84), torch.uint8),
    "terminated": ((), torch.float32),
}

FULL = {
    "w1_calls": 100_000, "w1_cap": 1_000_000, "w1_block": 1000, "w1_warmup": 2000,
    "w2_calls": 500, "w2_rows": 1000, "w2_cap": 1_000_000, "w2_block": 20, "w2_warmup": 1000,
    "w3_rows": 1_000_000, "w3_k": 256, "w3_calls": 3000, "w3_block": 100, "w3_warmup": 200,
    "w4_cap": 50_000, "w4_calls": 2000, "w4_k": 32, "w4_block": 50, "w4_warmup": 100,
    "w5_rows": 1_000_000, "w5_bs": 256, "w5_epochs": 5,
    "w6_rows": 1_000_000, "w6_reps": 3,
}  # fmt: skip
QUICK = {
    "w1_calls": 2000, "w1_cap": 10_000, "w1_block": 100, "w1_warmup": 200,
    "w2_calls": 40, "w2_rows": 1000, "w2_cap": 10_000, "w2_block": 5, "w2_warmup": 10,
    "w3_rows": 10_000, "w3_k": 256, "w3_calls": 200, "w3_block": 20, "w3_warmup": 20,
    "w4_cap": 500, "w4_calls": 200, "w4_k": 32, "w4_block": 20, "w4_warmup": 20,
    "w5_rows": 10_000, "w5_bs": 256, "w5_epochs": 2,
    "w6_rows": 10_000, "w6_reps": 1,
}  # fmt: skip

POOL = 1000  # distinct single transitions cycled through by the per-step workloads


def make_batch(spec: Spec, n: int, seed: int) -> Batch:
    """``n`` rows of ``spec``: random floats, bytes, 0/1 flags and a step counter."""
    g = torch.Generator().manual_seed(seed)
    out: Batch = {}
    for key, (shape, dtype) in spec.items():
        if dtype == torch.uint8:
            out[key] = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
        elif key in ("terminated", "truncated"):
            out[key] = (torch.rand((n, *shape), generator=g) < 0.01).to(dtype)
        elif dtype == torch.int64:
            out[key] = torch.arange(seed * n, seed * n + n) if key == "step" else torch.randint(0, 6, (n,), generator=g)
        else:
            out[key] = torch.randn((n, *shape), generator=g, dtype=dtype)
    return out


def rows_of(batch: Batch) -> list[dict[str, Any]]:
    """Single transitions as a gymnasium loop hands them over: tensors, and Python numbers for 0-d keys."""
    n = next(iter(batch.values())).shape[0]
    return [{k: (v[i].item() if v.dim() == 1 else v[i].clone()) for k, v in batch.items()} for i in range(n)]


def objectrl_transition(row: dict[str, Any], device: torch.device) -> Any:
    """The TensorDict ObjectRL's agent builds per env step (``generate_transition``)."""
    from tensordict import TensorDict

    return TensorDict(
        {k: (v.to(device) if isinstance(v, torch.Tensor) else (v if k == "step" else float(v))) for k, v in row.items()}
    )


def summary(block_means: list[float]) -> dict[str, float]:
    """Median, quartiles, 10th percentile and minimum of per-block means, in the unit given."""
    q = statistics.quantiles(block_means, n=4) if len(block_means) > 1 else block_means * 3
    p10 = statistics.quantiles(block_means, n=10)[0] if len(block_means) > 1 else block_means[0]
    return {
        "median": statistics.median(block_means),
        "q1": q[0],
        "q3": q[2],
        "p10": p10,
        "min": min(block_means),
        "blocks": len(block_means),
    }


def time_calls(call: Callable[[int], Any], n: int, block: int, warmup: int) -> dict[str, float]:
    """µs per ``call(i)``: ``warmup`` untimed calls, then ``n`` timed ones in blocks."""
    for i in range(warmup):
        call(i)
    gc.collect()
    pc, means, i = time.perf_counter_ns, [], warmup
    while i < warmup + n:
        m = min(block, warmup + n - i)
        t = pc()
        for j in range(i, i + m):
            call(j)
        means.append((pc() - t) / m / 1e3)
        i += m
    return summary(means)


def time_build_and_add(
    build: Callable[[int], Any], add: Callable[[Any], Any], n: int, block: int, warmup: int
) -> tuple[dict[str, float], dict[str, float]]:
    """µs per ``build(i)`` and per ``add(built)``, timed apart (the TensorDict cost is reported separately)."""
    for i in range(warmup):
        add(build(i))
    gc.collect()
    pc = time.perf_counter_ns
    build_means, add_means, i = [], [], warmup
    while i < warmup + n:
        m = min(block, warmup + n - i)
        tb = ta = 0
        for j in range(i, i + m):
            t0 = pc()
            item = build(j)
            t1 = pc()
            add(item)
            ta += pc() - t1
            tb += t1 - t0
        build_means.append(tb / m / 1e3)
        add_means.append(ta / m / 1e3)
        i += m
    return summary(build_means), summary(add_means)


def fill(peer: Peer, spec: Spec, rows: int, chunk: int = 100_000) -> None:
    """Store ``rows`` transitions (set-up, untimed), in chunks to bound the memory of the source data."""
    chunk = min(chunk, rows)
    source = make_batch(spec, chunk, seed=7)
    for start in range(0, rows, chunk):
        m = min(chunk, rows - start)
        peer.fill(source if m == chunk else {k: v[:m] for k, v in source.items()})


def rss() -> dict[str, float]:
    """Resident memory of this process in MB: anonymous, file-backed, shared memory (/dev/shm)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("RssAnon", "RssFile", "RssShmem"):
                    out[name] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def _minor_faults() -> int:
    """Minor page faults of this process so far (a write to a clean page of a shared file mapping is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---------------------------------------------------------------------------- the workloads
def w1_add(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """Single adds of a MuJoCo-like transition: mapping/native input, and ObjectRL's TensorDict."""
    rows = rows_of(make_batch(MUJOCO, POOL, seed=1))
    res: dict[str, Any] = {}
    for form in peer.forms:
        peer.create(p["w1_cap"], MUJOCO)
        if form == "td":
            build = lambda i: objectrl_transition(rows[i % POOL], torch.device("cpu"))  # noqa: E731
            res["td_build"], res["add_td"] = time_build_and_add(
                build, peer.add, p["w1_calls"], p["w1_block"], p["w1_warmup"]
            )
        else:
            items = [peer.convert(r, form, batched=False) for r in rows]
            call = lambda i, items=items: peer.add(items[i % POOL])  # noqa: E731
            res[f"add_{form}"] = time_calls(call, p["w1_calls"], p["w1_block"], p["w1_warmup"])
    return res


def w2_add_batch(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """add_batch of ``w2_rows`` rows per call into ``w2_cap``, in steady state.

    The untimed warm-up (``w2_warmup`` calls, a full ring by default) has touched every page, so the
    timed calls measure the copy and the library's overhead, not first-touch page faults.
    """
    batches = [make_batch(MUJOCO, p["w2_rows"], seed=10 + s) for s in range(4)]
    res: dict[str, Any] = {}
    for form in peer.forms:
        peer.create(p["w2_cap"], MUJOCO, batch_rows=p["w2_rows"])
        items = [peer.convert(b, form, batched=True) for b in batches]
        call = lambda i, items=items: peer.add_batch(items[i % 4])  # noqa: E731
        res[f"add_batch_{form}"] = time_calls(call, p["w2_calls"], p["w2_block"], p["w2_warmup"])
    return res


def w3_sample(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """sample(k) from a full buffer of ``w3_rows`` rows, delivered on the training device."""
    peer.create(p["w3_rows"], MUJOCO)
    fill(peer, MUJOCO, p["w3_rows"])
    sync = torch.cuda.synchronize if peer.device.type == "cuda" else (lambda: None)

    def call(i: int) -> None:
        peer.sample(p["w3_k"])
        sync()

    res = {"sample": time_calls(call, p["w3_calls"], p["w3_block"], p["w3_warmup"])}

    def next_batch(i: int) -> None:
        peer.next_batch(p["w3_k"])
        sync()

    try:
        res["get_next_batch"] = time_calls(next_batch, p["w3_calls"], p["w3_block"], p["w3_warmup"])
    except Unsupported as exc:
        res["get_next_batch"] = {"skipped": str(exc)}
    return res


def w4_atari(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """Atari frames: resident memory of a full buffer, steady-state single add, sample(32)."""
    rows = rows_of(make_batch(ATARI, 200, seed=2))
    cap = p["w4_cap"]
    stored_mb = cap * sum(int(torch.Size(s).numel()) * d.itemsize for s, d in ATARI.values()) / 2**20
    peer.create(2, ATARI)  # a tiny buffer first: imports and lazy set-up are not counted in the RSS
    fill(peer, ATARI, 2)
    form = peer.forms[0]
    items = [peer.convert(r, form, batched=False) for r in rows]
    peer.create(2, ATARI)
    gc.collect()
    before = rss()
    peer.create(cap, ATARI)
    fill(peer, ATARI, cap, chunk=1000)
    gc.collect()
    after = rss()
    res: dict[str, Any] = {"stored_mb": stored_mb, **{f"rss_{k}": after[k] - before[k] for k in after}}
    faults = _minor_faults()
    if form == "td":  # the TensorDict build is timed apart, as in workload 1
        build = lambda i: peer.convert(rows[i % 200], form, batched=False)  # noqa: E731
        _, res["atari_add"] = time_build_and_add(build, peer.add, p["w4_calls"], p["w4_block"], p["w4_warmup"])
    else:
        add = lambda i: peer.add(items[i % 200])  # noqa: E731
        res["atari_add"] = time_calls(add, p["w4_calls"], p["w4_block"], p["w4_warmup"])
    res["atari_add_faults"] = (_minor_faults() - faults) / (p["w4_calls"] + p["w4_warmup"])
    res["atari_sample"] = time_calls(lambda i: peer.sample(p["w4_k"]), p["w4_calls"] // 2, p["w4_block"], 10)
    return res


def w5_epoch(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """One full pass over ``w5_rows`` rows in batches of ``w5_bs``, in slot order and shuffled (ms/epoch)."""
    peer.create(p["w5_rows"], MUJOCO)
    fill(peer, MUJOCO, p["w5_rows"])
    res: dict[str, Any] = {}
    for shuffle in (False, True):
        name = "epoch_shuffled" if shuffle else "epoch"
        try:
            times = []
            for e in range(p["w5_epochs"] + 1):  # the first epoch is warm-up
                gc.collect()
                t = time.perf_counter_ns()
                count = sum(1 for _ in peer.epoch(p["w5_bs"], shuffle))
                if e:
                    times.append((time.perf_counter_ns() - t) / 1e6)
            assert count == -(-p["w5_rows"] // p["w5_bs"]), f"{count} batches"
            res[name] = summary(times)
        except Unsupported as exc:
            res[name] = {"skipped": str(exc)}
    return res


def w6_checkpoint(peer: Peer, p: dict[str, Any]) -> dict[str, Any]:
    """Save with data (fsync where the library does it) and load, of ``w6_rows`` rows (ms)."""
    peer.create(p["w6_rows"], MUJOCO)
    fill(peer, MUJOCO, p["w6_rows"])
    saves, loads, unverified = [], [], []
    for _ in range(p["w6_reps"]):
        folder = tempfile.mkdtemp(prefix="bench-ckpt-", dir=p.get("tmp_dir"))
        path = os.path.join(folder, "buffer")
        try:
            t = time.perf_counter_ns()
            peer.save(path)
            saves.append((time.perf_counter_ns() - t) / 1e6)
            t = time.perf_counter_ns()
            peer.load(path)
            loads.append((time.perf_counter_ns() - t) / 1e6)
            try:
                t = time.perf_counter_ns()
                peer.load_unverified(path)
                unverified.append((time.perf_counter_ns() - t) / 1e6)
            except Unsupported:
                pass
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    res = {"save": summary(saves), "load": summary(loads)}
    if unverified:
        res["load_unverified"] = summary(unverified)
    return res


WORKLOADS: dict[str, Callable[[Peer, dict[str, Any]], dict[str, Any]]] = {
    "1": w1_add,
    "2": w2_add_batch,
    "3": w3_sample,
    "4": w4_atari,
    "5": w5_epoch,
    "6": w6_checkpoint,
}
