"""Side-by-side benchmark of objectrl_buffer and its peers; prints a markdown table of medians and ratios.

Each (library, workload) pair runs in its own child process (``--child``) with one intra-op thread, on
the same generated data; the parent collects the results and divides each time by the "floor"'s time
from the same round. See ``benchmarks/README.md`` for the workloads and how to read the table.

    python benchmarks/bench.py                       # everything, full sizes (several minutes)
    python benchmarks/bench.py --quick -w 1,3        # smoke run of workloads 1 and 3
    python benchmarks/bench.py --repeat 3 -o benchmarks/results.md
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ALL_PEERS = ["floor", "limit", "objectrl_buffer", "objectrl", "torchrl", "sb3", "cpprb"]
TITLES = {"floor": "floor (NumPy ring)", "limit": "torch ring", "objectrl_buffer": "objectrl_buffer"}
TITLES["objectrl"] = "ObjectRL 0.2.1"
TITLES.update({"torchrl": "torchrl", "sb3": "SB3", "cpprb": "cpprb"})
STATS = {"median": "median", "p10": "10th percentile", "min": "minimum"}
DIR_VARIANT = "objectrl_buffer+dir"  # workload 4 again, with storage_dir: metrics get the suffix "@dir"
ATARI_ROW_MB = (2 * 4 * 84 * 84 + 8 + 4 + 4) / 2**20


def _n(count: int) -> str:
    """1000000 -> "1M", 50000 -> "50k", 500 -> "500"."""
    for size, unit in ((1_000_000, "M"), (1000, "k")):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def metrics(p: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    """Rows of the table: (metric key, label, unit, key of the floor's metric it is divided by)."""
    k1, k2, k3, k4, k5 = (_n(p[k]) for k in ("w1_cap", "w2_rows", "w3_rows", "w4_cap", "w5_rows"))
    return [
        ("add_np", f"1 add, dict of NumPy arrays and Python numbers ({k1} cap)", "µs", "add_np"),
        ("add_map", "1 add, dict of tensors and Python numbers", "µs", "add_np"),
        ("add_td", "1 add, ObjectRL TensorDict (add call alone)", "µs", "add_np"),
        ("td_build", "1 building that TensorDict (not in add)", "µs", None),
        ("add_batch_np", f"2 add_batch({k2}), dict of NumPy arrays ({_n(p['w2_cap'])} cap)", "µs", "add_batch_np"),
        ("add_batch_map", f"2 add_batch({k2}), dict of tensors", "µs", "add_batch_np"),
        ("add_batch_td", f"2 add_batch({k2}), TensorDict", "µs", "add_batch_np"),
        ("sample", f"3 sample({p['w3_k']}) from {k3} rows", "µs", "sample"),
        ("get_next_batch", f"3 get_next_batch({p['w3_k']}) (random-sampling phase)", "µs", "sample"),
        ("atari_add", f"4 Atari add, {k4} cap, steady state", "µs", "atari_add"),
        ("atari_add_faults", "4 Atari add: minor page faults per add", "", None),
        ("atari_sample", f"4 Atari sample({p['w4_k']})", "µs", "atari_sample"),
        ("atari_add@dir", "4 Atari add, with storage_dir", "µs", "atari_add"),
        ("atari_add_faults@dir", "4 Atari add: page faults per add, with storage_dir", "", None),
        ("atari_sample@dir", f"4 Atari sample({p['w4_k']}), with storage_dir", "µs", "atari_sample"),
        ("rss_RssAnon", f"4 anonymous RSS (stored: {p['w4_cap'] * ATARI_ROW_MB:.0f} MB)", "MB", None),
        ("rss_RssFile", "4 file-backed RSS", "MB", None),
        ("rss_RssShmem", "4 shared-memory RSS (/dev/shm)", "MB", None),
        ("rss_RssAnon@dir", "4 anonymous RSS, with storage_dir", "MB", None),
        ("rss_RssFile@dir", "4 file-backed RSS, with storage_dir", "MB", None),
        ("rss_RssShmem@dir", "4 shared-memory RSS, with storage_dir", "MB", None),
        ("epoch", f"5 epoch over {k5} rows, batches of {p['w5_bs']}, slot order", "ms", "epoch"),
        ("epoch_shuffled", "5 epoch, shuffled", "ms", "epoch_shuffled"),
        ("save", f"6 save with data, {_n(p['w6_rows'])} rows (fsync)", "ms", "save"),
        ("load", "6 load (crc32 checked: objectrl_buffer's default)", "ms", "load"),
        ("load_unverified", "6 load, verify=False", "ms", "load"),
    ]


# (metric, bound on objectrl_buffer / floor) as issue 12 sets them
TARGETS = [("add_np", 1.5), ("add_td", 3.0), ("atari_add", 2.0), ("sample", 1.0), ("get_next_batch", 1.0)]
TARGETS += [("load", 1.0), ("save", 1.5)]


# ---------------------------------------------------------------------------- child side
def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    # the objectrl_buffer of this checkout, not whichever one is installed
    sys.path[:0] = [str(HERE), *([str(HERE.parent)] if (HERE.parent / "objectrl_buffer").is_dir() else [])]
    from peers import PEERS, Unsupported, Upstream
    from workloads import WORKLOADS

    params = json.loads(args.params)
    name = "objectrl_buffer" if args.child == DIR_VARIANT else args.child
    peer = PEERS[name](device=args.device, storage_dir=args.storage_dir)
    if isinstance(peer, Upstream):
        peer.module_path = args.upstream_module or ""
    out: dict[str, Any] = {}
    for w in args.workload.split(","):
        try:
            out.update(WORKLOADS[w](peer, params))
        except Unsupported as exc:
            out[f"workload {w}"] = {"skipped": str(exc)}
    if args.child == DIR_VARIANT:
        out = {f"{k}@dir": v for k, v in out.items() if k != "stored_mb"}
    Path(args.result).write_text(json.dumps(out))


# ---------------------------------------------------------------------------- parent side
def atari_dir(args: argparse.Namespace) -> str:
    """Parent folder given as storage_dir to objectrl_buffer's second workload-4 run."""
    return str(args.atari_storage_dir or args.tmp_dir or tempfile.gettempdir())


def atari_default_dir(params: dict[str, Any]) -> str:
    """Where objectrl_buffer's default placement puts workload 4's buffer on this machine, now."""
    from objectrl_buffer.storage.placement import default_parent

    return default_parent(int(params["w4_cap"] * ATARI_ROW_MB * 2**20))


def run_child(peer: str, workload: str, params: dict[str, Any], args: argparse.Namespace, upstream: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RL_WARNINGS": "False"}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", peer, "--workload", workload]
        cmd += ["--params", json.dumps(params), "--result", result, "--device", args.device]
        if upstream:
            cmd += ["--upstream-module", upstream]
        if peer == DIR_VARIANT:
            cmd += ["--storage-dir", atari_dir(args)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not os.path.exists(result):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"skipped": f"failed (rc {proc.returncode}): {tail[0][:160]}"}
        return json.loads(Path(result).read_text())


def versions() -> str:
    names = ["torch", "torchrl", "tensordict", "numpy", "stable-baselines3", "cpprb", "objectrl_buffer"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"commit {commit.stdout.strip() or '?'}"
    )


def fs_type(path: str) -> str:
    """File system type of the mount holding ``path`` (e.g. ext4, tmpfs), from /proc/mounts."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                inside = len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/"))
                if inside and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _cell(values: list[float], ratios: list[float], unit: str) -> str:
    value = statistics.median(values)
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    if ratios:
        text += f" ({statistics.median(ratios):.2f}x)"
    return text


def report(rounds: list[dict[str, dict[str, Any]]], params: dict[str, Any], peers: list[str], args: Any) -> str:
    """Markdown: header, one row per metric, one column per library, then the targets of issue 4."""
    columns = [p for p in peers if p != DIR_VARIANT]
    stat = args.stat
    baselines = {k: base for k, _, _, base in metrics(params)}

    def series(peer: str, key: str) -> tuple[list[float], list[float]]:
        values, ratios = [], []
        for rnd in rounds:
            merged = {**rnd.get(peer, {}), **rnd.get(DIR_VARIANT, {})} if peer == "objectrl_buffer" else rnd.get(peer)
            entry = (merged or {}).get(key)
            if entry is None or (isinstance(entry, dict) and "median" not in entry):
                continue
            value = entry[stat] if isinstance(entry, dict) else float(entry)
            values.append(value)
            base = baselines[key]
            floor = (rnd.get("floor") or {}).get(base) if base else None
            if isinstance(floor, dict) and floor.get(stat):
                ratios.append(value / floor[stat])
        return values, ratios

    lines = [
        f"Date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}  ",
        f"Machine: {machine()}  ",
        f"Versions: {versions()}  ",
        f"Storage folders (workload 4): objectrl_buffer default {atari_default_dir(params)} "
        f"({fs_type(atari_default_dir(params))}, chosen by objectrl_buffer.storage.placement); "
        f"storage_dir {atari_dir(args)} ({fs_type(atari_dir(args))}); "
        f"floor, torch ring, SB3, cpprb: anonymous memory; ObjectRL, torchrl: /dev/shm  ",
        f"Run: {'--quick' if args.quick else 'full sizes'}, device {args.device}, torch.set_num_threads(1), "
        f"{len(rounds)} round(s); each cell is the median over rounds of the per-round {STATS[stat]} "
        "of per-block means (blocks of calls after warm-up); (ratio) = this library / the floor (NumPy ring) "
        "in the same round, median over rounds.",
        "",
        "| workload | unit | " + " | ".join(TITLES.get(p, p) for p in columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for key, label, unit, _ in metrics(params):
        cells = []
        for peer in columns:
            values, ratios = series(peer, key)
            cells.append(_cell(values, ratios, unit) if values else "")
        if any(cells):
            lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    notes: dict[str, set[str]] = {}
    for peer in peers:
        for rnd in rounds:
            for key, entry in rnd.get(peer, {}).items():
                if key == "skipped":
                    notes.setdefault(peer, set()).add(str(entry))
                elif isinstance(entry, dict) and "skipped" in entry:
                    notes.setdefault(peer, set()).add(f"{key}: {entry['skipped']}")
    lines += ["", "Targets of issue 12 (objectrl_buffer / floor; median and range over rounds):", ""]
    lines += ["| target | bound | ratio | range | met |", "|---|---:|---:|---|---|"]
    for key, bound in TARGETS:
        _, ratios = series("objectrl_buffer", key)
        if ratios:
            med = statistics.median(ratios)
            ok = "yes" if med <= bound else "NO"
            lines.append(f"| {key} | {bound}x | {med:.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | {ok} |")
    for key in ("add_map", "add_np"):  # same input form on both sides
        sb3 = dict(enumerate(series("sb3", key)[0]))
        ours = series("objectrl_buffer", key)[0]
        ratios = [v / sb3[i] for i, v in enumerate(ours) if i in sb3]
        if ratios:
            med = statistics.median(ratios)
            lines.append(f"| {key} faster than SB3 add | 1.0x of SB3 | {med:.2f}x of SB3 | "
                         f"{min(ratios):.2f}-{max(ratios):.2f} | {'yes' if med < 1 else 'NO'} |")  # fmt: skip
    anon = series("objectrl_buffer", "rss_RssAnon@dir")[0]
    if anon:
        share = statistics.median(anon) / (params["w4_cap"] * ATARI_ROW_MB)
        lines.append(f"| anon RSS with storage_dir < 10% of stored | 10% | {share:.1%} | "
                     f"{min(anon):.0f}-{max(anon):.0f} MB | {'yes' if share < 0.1 else 'NO'} |")  # fmt: skip
    if notes:
        lines += ["", "Not measured:"]
        for peer, items in notes.items():
            lines.append(f"- {TITLES.get(peer, peer)}: " + "; ".join(sorted(items)))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run in well under a minute")
    ap.add_argument("-w", "--workloads", default="1,2,3,4,5,6", help="comma-separated workload numbers")
    ap.add_argument("-p", "--peers", default=",".join(ALL_PEERS), help=f"comma-separated, from {ALL_PEERS}")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (each in fresh processes), interleaved")
    ap.add_argument("--device", default="cpu", help="training device samples are delivered to (workload 3)")
    ap.add_argument(
        "--stat",
        choices=list(STATS),
        default="median",
        help="statistic of the per-block means (p10/min resist load from other processes better)",
    )
    ap.add_argument(
        "--atari-storage-dir",
        help="storage_dir of objectrl_buffer's second workload-4 run (default: a new folder in --tmp-dir)",
    )
    ap.add_argument("-o", "--output", help="also write the markdown table to this file")
    ap.add_argument("--json", help="write the raw per-round results to this file")
    ap.add_argument("--from-json", help="only render the table from a file written by --json (e.g. with --stat p10)")
    ap.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "objectrl_buffer_bench"))
    ap.add_argument("--objectrl-wheel", help="use this ObjectRL 0.2.1 wheel instead of downloading it")
    ap.add_argument("--no-download", action="store_true", help="never run pip download for the ObjectRL wheel")
    ap.add_argument("--tmp-dir", help="folder for storage_dir and checkpoint files (default: system temp)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=N", help="override a size, e.g. w1_calls=5000")
    # child mode (internal)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--upstream-module", help=argparse.SUPPRESS)
    ap.add_argument("--storage-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        args.quick, peers = saved.get("quick", False), saved["peers"]
        print(report(saved["rounds"], saved["params"], peers, args))
        return
    sys.path.insert(0, str(HERE))
    from peers import Unsupported, upstream_module_path
    from workloads import FULL, QUICK

    params = dict(QUICK if args.quick else FULL)
    for item in args.set:
        key, _, value = item.partition("=")
        params[key] = int(value)
    if args.tmp_dir:
        params["tmp_dir"] = args.tmp_dir
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(ALL_PEERS)
    if unknown:
        ap.error(f"unknown peer(s) {sorted(unknown)}; choose from {ALL_PEERS}")
    upstream, upstream_note = "", ""
    if "objectrl" in peers:
        try:
            upstream = upstream_module_path(args.cache_dir, args.objectrl_wheel, download=not args.no_download)
        except (Unsupported, OSError) as exc:
            upstream_note = str(exc)
    if "objectrl_buffer" in peers and "4" in args.workloads.split(","):
        peers.append(DIR_VARIANT)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    # one child per (library, workload); --quick groups a library's workloads in one child (faster start-up,
    # but memory figures of workload 4 then include what earlier workloads left behind)
    jobs = [[w] for w in workloads] if not args.quick else [workloads]
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeat):
        results: dict[str, dict[str, Any]] = {p: {} for p in peers}
        for job in jobs:
            for peer in peers:
                todo = ["4"] if peer == DIR_VARIANT and "4" in job else [] if peer == DIR_VARIANT else job
                if not todo:
                    continue
                if peer == "objectrl" and not upstream:
                    results[peer] = {"skipped": upstream_note}
                    continue
                print(f"[round {r + 1}/{args.repeat}] workload {','.join(todo)}: {peer}", file=sys.stderr, flush=True)
                out = run_child(peer, ",".join(todo), params, args, upstream)
                if set(out) == {"skipped"}:
                    out = {f"workload {','.join(todo)}": {"skipped": out["skipped"]}}
                results[peer].update(out)
        rounds.append(results)
    table = report(rounds, params, peers, args)
    print(table)
    if args.output:
        Path(args.output).write_text(table)
    if args.json:
        saved = {"params": params, "rounds": rounds, "peers": peers, "quick": args.quick}
        Path(args.json).write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
