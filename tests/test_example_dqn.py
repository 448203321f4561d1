"""End-to-end checks of the main job, examples/dqn_cartpole.py.

The quick tests run a few hundred env steps (seconds): the loop, the PNG, the buffer-time report, the
full save and ``--resume`` (rows, learner, global step), and ObjectRL's metadata-only save and resume.
The full default run (the >= 195 criterion) takes about a minute or more on 2 CPU cores and runs only
with ``RUN_SLOW=1``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from tests.support import assert_td_equal, loaded_script

pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dqn_cartpole.py"


@pytest.fixture(scope="module")
def dqn() -> Iterator[ModuleType]:
    with loaded_script(EXAMPLE, "dqn_cartpole") as module:
        yield module


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    """A run of seconds: small buffer and batches, a learn call every 50 env steps."""
    return [
        "--total-steps", "300", "--learning-starts", "100", "--learn-frequency", "50", "--max-iter", "4",
        "--batch-size", "16", "--buffer-size", "1000", "--hidden", "16", "--no-progress",
        "--storage-dir", str(tmp_path), *extra,
    ]  # fmt: skip


def test_runs_end_to_end_and_reports(dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "curve.png"
    result = dqn.main(tiny(tmp_path, "--plot", str(plot)))
    out = capsys.readouterr().out

    assert isinstance(result, float) and math.isfinite(result)  # random CartPole episodes last ~20 steps
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "buffer time: " in out and "%" in out
    assert "global steps 0 -> 300" in out
    assert "gradient steps: 16" in out  # learn calls at global steps 149, 199, 249, 299; 4 each
    assert out.strip().splitlines()[-1] == f"mean return over last 20 episodes: {result:.1f}"


@pytest.mark.parametrize("plain_dict", [False, True], ids=["tensordict", "plain-dict"])
def test_save_then_resume_from_metadata(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], plain_dict: bool
) -> None:
    flag = ["--plain-dict"] if plain_dict else []
    first = tmp_path / "first"
    dqn.main(tiny(tmp_path, "--plot", "", "--save", str(first), "--no-save-data", *flag))

    meta = torch.load(f"{first}.metadata", weights_only=True)
    assert (meta["buffer_size"], meta["data_size"], meta["pointer"]) == (1000, 300, 300)
    assert "data_dir" not in meta and not list(tmp_path.glob("first.data-*"))  # ObjectRL's three counters
    agent = torch.load(f"{first}.agent.pt", weights_only=True)
    assert agent["global_step"] == 300 and "q_network" in agent

    second = tmp_path / "second"
    capsys.readouterr()
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):  # ObjectRL's resume: counters, no rows
        dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "200", "--resume-metadata", str(first),
                      "--save", str(second), *flag))  # fmt: skip
    out = capsys.readouterr().out

    assert "global steps 300 -> 500" in out
    assert torch.load(f"{second}.agent.pt", weights_only=True)["global_step"] == 500
    # The metadata holds counters, not rows: the resumed buffer refills from empty.
    assert torch.load(f"{second}.metadata", weights_only=True)["data_size"] == 200


def rows(path: Path, storage: Path) -> TensorDict:
    """Every row of the buffer checkpoint at ``path``, oldest first."""
    return ReplayBuffer.from_checkpoint(path, storage_dir=storage).sample_all()


def test_resume_continues_with_the_saved_rows_and_learns_at_once(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, again, second = tmp_path / "first", tmp_path / "again", tmp_path / "second"
    dqn.main(tiny(tmp_path, "--plot", "", "--save", str(first)))  # 300 steps; --save writes the rows by default
    saved_rows = rows(first, tmp_path)
    assert len(saved_rows) == 300 and saved_rows["step"].tolist() == list(range(300))

    # Zero new steps: what is saved again is exactly what was resumed, rows and learner alike.
    capsys.readouterr()
    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "0", "--resume", str(first), "--save", str(again)))
    out = capsys.readouterr().out
    assert f"resumed from {first}: 300 rows (capacity 1000, pointer 300), global step 300" in out
    assert_td_equal(rows(again, tmp_path), saved_rows)
    saved, resumed = (torch.load(f"{p}.agent.pt", weights_only=True) for p in (first, again))
    for part in ("q_network", "target_network"):
        for key, value in saved[part].items():
            assert torch.equal(value, resumed[part][key]), (part, key)
    assert resumed["optimizer"]["state"].keys() == saved["optimizer"]["state"].keys()
    assert (resumed["episode_returns"], resumed["gradient_steps"]) == (saved["episode_returns"], 16)

    # 200 more steps: the first learn call (global step 349) comes 50 steps in, on the 350 rows held then.
    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "200", "--resume", str(first), "--save", str(second)))
    out = capsys.readouterr().out
    assert "global steps 300 -> 500" in out
    assert "gradient steps: 16" in out  # learn calls at global steps 349, 399, 449, 499: no warm-up again
    continued = rows(second, tmp_path)
    assert continued["step"].tolist() == list(range(500))
    assert_td_equal(continued[:300], saved_rows)  # the first run's rows, kept in the resumed buffer
    agent = torch.load(f"{second}.agent.pt", weights_only=True)
    assert (agent["global_step"], agent["gradient_steps"]) == (500, 32)
    assert not torch.equal(agent["q_network"]["net.0.weight"], saved["q_network"]["net.0.weight"])  # it learned

    # An epoch pass makes ceil(rows / 16) gradient steps: the first learn call sees the 300 old rows + 50 new.
    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "50", "--n-epochs", "1", "--resume", str(first)))
    assert f"gradient steps: {math.ceil(350 / 16)}" in capsys.readouterr().out


def test_resume_needs_the_rows(dqn: ModuleType, tmp_path: Path) -> None:
    first = tmp_path / "first"
    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "100", "--save", str(first), "--no-save-data"))
    with (
        pytest.raises(SystemExit, match=r"holds counters but no rows .* use --resume-metadata"),
        pytest.warns(RuntimeWarning, match="metadata-only checkpoint"),
    ):
        dqn.main(tiny(tmp_path, "--plot", "", "--resume", str(first)))
    with pytest.raises(SystemExit) as usage:  # one kind of resume at a time
        dqn.main(tiny(tmp_path, "--plot", "", "--resume", str(first), "--resume-metadata", str(first)))
    assert usage.value.code == 2


def test_resume_without_the_agent_file_counts_from_the_newest_row(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first"
    # A ring of 128 rows that wrapped: the newest row's step, not the row count, gives the global step.
    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "200", "--buffer-size", "128", "--save", str(first)))
    os.remove(f"{first}.agent.pt")
    capsys.readouterr()

    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "50", "--resume", str(first)))

    out = capsys.readouterr().out
    assert "128 rows (capacity 128, pointer 72), global step 200" in out and "global steps 200 -> 250" in out


def test_resume_restores_the_learner_and_the_episode_history(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    result = dqn.main(tiny(tmp_path, "--plot", "", "--save", str(first)))

    # Zero new steps: what is saved again is exactly what was restored.
    again = dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "0", "--resume-metadata", str(first),
                          "--save", str(second)))  # fmt: skip

    assert again == result  # same last-20 episodes, carried over
    saved, restored = (torch.load(f"{p}.agent.pt", weights_only=True) for p in (first, second))
    assert saved["q_network"].keys() == restored["q_network"].keys()
    for key, value in saved["q_network"].items():
        assert torch.equal(value, restored["q_network"][key]), key
    assert restored["episode_returns"] == saved["episode_returns"]
    assert restored["global_step"] == saved["global_step"] == 300


def test_resume_from_metadata_alone_counts_from_data_size(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first"
    dqn.main(tiny(tmp_path, "--plot", "", "--save", str(first)))
    os.remove(f"{first}.agent.pt")
    capsys.readouterr()

    dqn.main(tiny(tmp_path, "--plot", "", "--total-steps", "100", "--resume-metadata", str(first)))

    assert "global steps 300 -> 400" in capsys.readouterr().out


def test_epoch_mode_learns_over_the_whole_buffer(
    dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # n_epochs=1: each learn call passes once over the N stored rows, ceil(N / 16) gradient steps.
    dqn.main(tiny(tmp_path, "--plot", "", "--n-epochs", "1", "--total-steps", "200", "--loss", "mse", "--no-double"))

    steps = sum(math.ceil(n / 16) for n in (150, 200))  # learn calls at global steps 149 and 199
    assert f"gradient steps: {steps}" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="the full default run takes minutes: set RUN_SLOW=1")
def test_default_run_solves_cartpole(dqn: ModuleType, tmp_path: Path) -> None:
    assert dqn.main(["--no-progress", "--plot", str(tmp_path / "curve.png")]) >= dqn.SOLVED_RETURN
