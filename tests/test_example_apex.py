"""End-to-end checks of examples/apex_dqn.py (Ape-X-style DQN over a Ray-served prioritized buffer).

The quick checks: Ape-X's epsilons, and the learner-side gate that keeps the replay ratio (against Reverb's
rule, with a fake handle, no Ray). The short run starts a local Ray in a child process (about 15-30 s, most of
it Ray's start-up) and checks what the run must produce: every actor's rows in the buffer, draws of both
actors' rows, every priority update applied, the ratio inside the limiter's window, the summary and the PNG.
The full default run (the >= 195 criterion, minutes on 2 CPU cores) runs only with ``RUN_SLOW=1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray")
pytest.importorskip("gymnasium")
pytest.importorskip("tqdm")

from objectrl_buffer.flow import SampleToInsertRatio
from tests.support import loaded_script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "apex_dqn.py"


@pytest.fixture(scope="module")
def apex() -> Iterator[ModuleType]:
    with loaded_script(EXAMPLE, "apex_dqn") as module:
        yield module


def test_apex_epsilons(apex: ModuleType) -> None:
    assert apex.apex_epsilons(2, 0.4, 7.0) == pytest.approx([0.4, 0.4**8])
    eight = apex.apex_epsilons(8, 0.4, 7.0)
    assert eight[0] == pytest.approx(0.4) and eight[-1] == pytest.approx(0.4**8)
    assert eight == sorted(eight, reverse=True)
    assert apex.apex_epsilons(1, 0.4, 7.0) == [0.4]


def test_solved_from_is_where_the_last_run_of_passing_evaluations_starts(apex: ModuleType) -> None:
    curve = apex.Curve()
    assert curve.solved_at() is None
    curve.evals = [(1000, 500.0, 10.0), (2000, 120.0, 20.0), (3000, 195.0, 30.0), (4000, 500.0, 40.0)]
    assert curve.solved_at() == (3000, 30.0)  # a lucky early 500 that did not hold does not count
    curve.evals.append((5000, 194.9, 50.0))
    assert curve.solved_at() is None


class FakeHandle:
    """What LearnerGate reads of a RemoteBuffer: the rows it holds."""

    def __init__(self) -> None:
        self.rows = 0

    def __len__(self) -> int:
        return self.rows


@settings(max_examples=60, deadline=None)
@given(
    spi=st.sampled_from([0.5, 1.0, 4.0, 16.0]),
    min_size=st.integers(1, 50),
    slack=st.integers(2, 200),
    moves=st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=60),
)
def test_gate_keeps_reverbs_ratio(
    apex: ModuleType, spi: float, min_size: int, slack: int, moves: list[tuple[bool, int]]
) -> None:
    """Actors that write up to the budget and a learner that samples what the gate admits keep
    ``min_diff <= inserts * spi - samples <= max_diff`` past the fill-up; the budget is Reverb's insert rule."""
    limiter = SampleToInsertRatio(spi, min_size, slack * max(1.0, spi))
    handle = FakeHandle()
    gate = apex.LearnerGate(limiter, handle)
    for write, n in moves:
        if write:  # the actors write as far as they are allowed
            handle.rows = min(handle.rows + n, gate.budget())
        else:
            before = limiter.samples
            admitted = gate.try_sample(n)
            assert limiter.samples == before + (n if admitted else 0)
        budget = gate.budget()
        if budget > limiter.inserts:
            assert limiter.can_insert(budget - limiter.inserts)
        assert budget <= max(min_size, limiter.inserts) or limiter.can_insert(budget - limiter.inserts)
        assert not limiter.can_insert(budget + 1 - limiter.inserts) or budget + 1 <= min_size
        if limiter.samples:
            assert limiter.min_diff <= limiter.diff <= limiter.max_diff
    gate.count_inserts()
    assert limiter.inserts == handle.rows  # every row written was counted once


def run_example(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """The example as a script in a child process (Ray pickles its actor class by value from ``__main__``),
    importing this checkout's package (Ray's workers inherit ``PYTHONPATH``)."""
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


TOTAL, BATCH = 600, 16
# Both short runs in one child process and one local Ray (its start-up is most of a short run): the example's
# main() leaves a Ray it did not start running. run_path's module is gone from sys.modules once it has run,
# so Ray pickles the actor class by value, as it does from a script's __main__.
DRIVER = """
import json, runpy, sys
import ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
main = runpy.run_path(sys.argv[1])["main"]
for mode, argv in json.loads(sys.argv[2]).items():
    print(f"=== {mode}", flush=True)
    main(argv)
ray.shutdown()
"""


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], str, Path]]:
    """``mode -> (summary, stdout, plot)`` of a short run with the learner's gate and one with
    ``--server-limiter``."""
    tmp = tmp_path_factory.mktemp("apex")
    common = [
        "--total-steps", str(TOTAL), "--min-size", "100", "--batch-size", str(BATCH),
        "--samples-per-insert", "2", "--error-buffer", "64", "--hidden", "16", "--buffer-size", "1000",
        "--eval-every", "300", "--eval-episodes", "1", "--final-episodes", "2", "--broadcast-every", "5",
        "--writer-batch", "8", "--no-progress",
    ]  # fmt: skip
    modes = {"gate": [], "server": ["--server-limiter"]}  # one shard: each actor is a process start-up
    argv = {
        mode: [*common, *extra, "--plot", str(tmp / f"{mode}.png"), "--summary", str(tmp / f"{mode}.json")]
        for mode, extra in modes.items()
    }
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(EXAMPLE), json.dumps(argv)],
        cwd=tmp, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = dict(part.split("\n", 1) for part in done.stdout.split("=== ")[1:])
    return {
        mode: (json.loads((tmp / f"{mode}.json").read_text()), outputs[mode], tmp / f"{mode}.png") for mode in modes
    }


def check_short_run(run: dict[str, Any], stdout: str, plot: Path) -> None:
    """What every short run must produce: every actor's rows in the buffer, draws of both actors' rows, every
    priority update applied, the summary and the PNG."""
    assert "mean greedy return over 2 evaluation episodes: " in stdout
    assert sum(run["rows_written"]) == TOTAL and len(run["rows_written"]) == 2
    assert run["rows_held"] == TOTAL  # every row the actors wrote reached the buffer
    assert all(n > 0 for n in run["sampled_rows_by_actor"])  # the learner drew rows of both actors
    sampled = run["updates"] * BATCH
    assert run["updates"] > 0 and sum(run["sampled_rows_by_actor"]) == sampled
    assert run["priority_updates_applied"] == sampled  # no slot was rewritten (capacity 1000 > 600 rows)
    assert abs(run["priority_mass"] - TOTAL) > 1  # the priorities moved off the new rows' 1.0
    assert [step for step, _ in run["evaluations"]] == [300, 600]
    assert ("every evaluation >= 195" in stdout) == (run["solved_from_step"] is not None)
    assert math.isfinite(run["mean_return"])
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_short_run_writes_samples_and_updates_priorities(short_runs: dict[str, Any]) -> None:
    run, stdout, plot = short_runs["gate"]
    check_short_run(run, stdout, plot)
    assert not run["server_limiter"]
    limiter = run["limiter"]
    assert limiter["inserts"] == TOTAL and limiter["samples"] == run["updates"] * BATCH
    # The learner drew until the ratio admitted no more: the window's floor is reached, never crossed.
    assert limiter["min_diff"] <= limiter["diff"] < limiter["min_diff"] + BATCH


def test_short_run_with_the_buffers_limiter(short_runs: dict[str, Any]) -> None:
    """``--server-limiter``: the remote buffer's own limiter admits the actors' writes and the learner's draws;
    the run ends once the actors are done, with the ratio inside Reverb's window (the limiter over several
    shards: tests/distributed/test_remote.py)."""
    run, stdout, plot = short_runs["server"]
    check_short_run(run, stdout, plot)
    assert run["server_limiter"]
    limiter = run["limiter"]  # the coordinator's counters
    assert limiter["inserts"] == TOTAL
    trained = run["updates"] * BATCH  # prefetched draws count when sent: at most PREFETCH_DEPTH more per stream
    assert trained <= limiter["samples"]
    assert limiter["min_diff"] <= limiter["diff"] <= limiter["max_diff"]
    assert "the buffer's limiter" in stdout


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="the full default run takes minutes: set RUN_SLOW=1")
def test_default_run_solves_cartpole(tmp_path: Path) -> None:
    summary = tmp_path / "apex.json"
    done = run_example(["--no-progress", "--plot", "", "--summary", str(summary)], tmp_path, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(summary.read_text())["mean_return"] >= 195
