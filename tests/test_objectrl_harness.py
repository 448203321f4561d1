"""The pure helpers of ``benchmarks/objectrl_harness.py`` (no ObjectRL needed; the real runs are manual).

The real runs: ``python benchmarks/objectrl_harness.py --out runs/objectrl_harness.md`` (see its docstring).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "objectrl_harness.py"


@pytest.fixture(scope="module")
def harness() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("objectrl_harness", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


LOG = """\
11-24 05:30:01 INFO     Experiment with seed no 1
11-24 05:30:01 CRITICAL EVALUATION\tN-steps:       0\tMean_Reward:      9.400\tIQM_Reward:      9.333
11-24 05:30:02 INFO     Episode:    1\tN-steps:      21\tReward:     22.000
11-24 05:30:02 INFO     Episode:    2\tN-steps:      35\tReward:     14.000
11-24 05:30:03 INFO     Episode:    3\tN-steps:      60\tReward:   -125.500
11-24 05:30:09 CRITICAL EVALUATION\tN-steps:    2999\tMean_Reward:    187.250\tIQM_Reward:    190.000
11-24 05:30:09 INFO     Training time: 8.12 seconds
"""


def test_parse_objectrl_log(harness: types.ModuleType) -> None:
    log = harness.parse_objectrl_log(LOG)
    assert log.episode_returns == [22.0, 14.0, -125.5]
    assert log.episode_end_steps == [21, 35, 60]
    assert log.evals == [(0, 9.4), (2999, 187.25)]
    assert log.final_eval == 187.25
    assert log.training_time_s == 8.12
    assert log.last_mean(2) == pytest.approx((14.0 - 125.5) / 2)
    assert harness.parse_objectrl_log("").last_mean() is None


def test_patch_name_replaces_every_holder_of_the_original(harness: types.ModuleType) -> None:
    class Upstream:
        pass

    class Ours:
        pass

    defining = types.ModuleType("fake.experience_memory")
    defining.ReplayBuffer = Upstream  # type: ignore[attr-defined]
    importer = types.ModuleType("fake.base_agent")
    importer.ReplayBuffer = Upstream  # type: ignore[attr-defined]
    other = types.ModuleType("fake.other")
    other.ReplayBuffer = object  # type: ignore[attr-defined]  # same name, different object: left alone
    lazy = types.ModuleType("fake.lazy")
    lazy.__getattr__ = lambda name: pytest.fail("module __getattr__ must not be called")  # type: ignore[attr-defined]
    modules = {"b": importer, "a": defining, "c": other, "d": lazy, "e": None}

    assert harness.patch_name(modules, "ReplayBuffer", Upstream, Ours) == ["a", "b"]
    assert defining.ReplayBuffer is Ours and importer.ReplayBuffer is Ours  # type: ignore[attr-defined]
    assert other.ReplayBuffer is object  # type: ignore[attr-defined]
    assert harness.patch_name(modules, "ReplayBuffer", Upstream, Ours) == []


def test_make_timed_class_times_outermost_calls_only(harness: types.ModuleType) -> None:
    class Fake:
        def __init__(self, n: int) -> None:
            self.rows: list[int] = []
            self.n = n

        def add(self, x: int) -> None:
            self.rows.append(x)

        def sample_batch(self, k: int) -> list[int]:
            return self.rows[:k]

        def get_next_batch(self, k: int) -> list[int]:
            return self.sample_batch(k)

        def __len__(self) -> int:
            return len(self.rows)

    ticks = iter(range(0, 10_000, 5))  # every clock read advances 5 ns
    calls: dict[str, list[int]] = {}
    timed = harness.make_timed_class(Fake, calls, clock=lambda: next(ticks))
    rb = timed(3)
    assert isinstance(rb, Fake) and type(rb).__name__ == "Fake"
    rb.add(1)
    rb.add(2)
    assert rb.get_next_batch(1) == [1] and len(rb) == 2
    assert calls["__init__"] == [5] and calls["add"] == [5, 5]
    assert calls["get_next_batch"] == [5]
    assert calls["sample_batch"] == []  # called from get_next_batch: counted there only
    assert calls["__len__"] == [5]

    summary = harness.summarize_calls(calls)
    assert "sample_batch" not in summary
    assert summary["add"] == {"count": 2, "total_s": 10e-9, "median_us": 0.005, "p90_us": 0.005}


def test_timed_call_still_records_when_the_method_raises(harness: types.ModuleType) -> None:
    class Failing:
        def add(self, x: int) -> None:
            raise ValueError("bad write")

        def sample_batch(self, k: int) -> int:
            return k

    calls: dict[str, list[int]] = {}
    rb = harness.make_timed_class(Failing, calls)()
    with pytest.raises(ValueError, match="bad write"):
        rb.add(1)
    assert len(calls["add"]) == 1
    assert rb.sample_batch(4) == 4 and len(calls["sample_batch"]) == 1  # depth was reset after the error


def _result(harness: types.ModuleType, buffer: str, returns: list[float], **kwargs: object) -> object:
    log = harness.LogSummary(
        episode_returns=returns,
        episode_end_steps=[10 * (i + 1) for i in range(len(returns))],
        evals=[(0, 9.0), (2999, 100.0)],
    )
    calls = {
        "add": {"count": 3000, "total_s": 0.09, "median_us": 30.0, "p90_us": 40.0},
        "get_next_batch": {"count": 2000, "total_s": 0.2, "median_us": 100.0, "p90_us": 120.0},
    }
    return harness.RunResult(
        "sac",
        "cheetah",
        buffer,
        1,
        kwargs.pop("status", "finished"),
        calls=calls,
        log=log,
        run_s=29.0,
        wall_s=35.0,
        **kwargs,
    )


def test_format_table_and_report(harness: types.ModuleType) -> None:
    ok = _result(harness, "upstream", [1.0, 2.0, 3.0])
    failed = _result(
        harness,
        "ours",
        [1.0],
        status="failed",
        error="SchemaError: key 'action': the buffer stores shape=() | dtype",
        traceback="Traceback (most recent call last):\n  ...\nSchemaError: key 'action'",
    )
    table = harness.format_table([ok, failed])
    lines = table.splitlines()
    assert len(lines) == 4 and all(line.startswith("|") and line.endswith("|") for line in lines)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == lines[3].count("|")
    row = "| sac | cheetah | upstream | finished | 3 | 2.0 | 100.0 | 35.0 | 29.0 | 0.29 | 1.0% | 30.0 | 100.0 |"
    assert row in table
    assert "failed: SchemaError: key 'action': the buffer stores shape=() / dtype" in table  # no stray column

    report = harness.format_report([ok, failed], [(ok, _result(harness, "upstream", [1.0, 2.0, 3.0]))], ["Header"])
    assert "## Failures" in report and "### sac / ours: failed" in report
    assert "SchemaError: key 'action'\n```" in report
    assert "| `add` | 3000 | 90.0 | 30.0 | 40.0 |" in report
    assert "| sac | upstream | 1 | yes |" in report


def test_compare_runs(harness: types.ModuleType) -> None:
    a = _result(harness, "ours", [1.0, 2.0, 3.0])
    assert harness.compare_runs(a, _result(harness, "ours", [1.0, 2.0, 3.0]))[0] == "yes"
    verdict, detail = harness.compare_runs(a, _result(harness, "ours", [1.0, 2.5, 3.0]))
    assert verdict == "no" and detail.startswith("episode 2 (ends at step 20): 2.0 vs 2.5")
    assert harness.compare_runs(a, _result(harness, "ours", [1.0, 2.0]))[0] == "no"
    assert harness.compare_runs(a, _result(harness, "ours", [1.0], status="failed"))[0] == "n/a"


def test_objectrl_args(harness: types.ModuleType, tmp_path: Path) -> None:
    args = harness.objectrl_args(harness.ALGOS["dqn"], 7, tmp_path, eval_episodes=3)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--model.name"] == "dqn" and flags["--env.name"] == "cartpole"
    assert flags["--system.seed"] == "7" and flags["--training.max_steps"] == "3000"
    assert flags["--training.eval_frequency"] == "3000" and flags["--training.warmup_steps"] == "1000"
    assert flags["--system.device"] == flags["--system.storing_device"] == "cpu"
    assert flags["--logging.result_path"] == str(tmp_path)
    ppo = dict(zip(*[iter(harness.objectrl_args(harness.ALGOS["ppo"], 1, tmp_path, steps=100))] * 2, strict=True))
    assert ppo["--training.warmup_steps"] == "0" and ppo["--training.max_steps"] == "100"


def test_warning_lines(harness: types.ModuleType) -> None:
    stderr = "x.py:3: UserWarning: cast action\n  warnings.warn(\nx.py:3: UserWarning: cast action\nnoise\n"
    assert harness.warning_lines(stderr) == ["x.py:3: UserWarning: cast action"]


def test_wrap_bare_action(harness: types.ModuleType) -> None:
    class Bare(list):  # stands in for torch.Tensor
        pass

    class Agent:
        def select_action(self, state: int, is_training: bool = True) -> object:
            return Bare([state]) if is_training else {"action": state}

    Agent.select_action = harness.wrap_bare_action(Agent.select_action, Bare)  # type: ignore[method-assign]
    assert Agent().select_action(3) == {"action": Bare([3])}
    assert Agent().select_action(3, is_training=False) == {"action": 3}  # already a mapping: unchanged
