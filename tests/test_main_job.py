"""The main job's numbers reproduce (examples/dqn_cartpole.py, run by ``make train``).

A short re-run (``python examples/dqn_cartpole.py --short-reference``, a second or two) must give, bit for bit,
the record committed in docs/dqn_cartpole_short.json: every episode's return and end step, and a digest of the
final Q-network weights. Anything that moves the curve (what the buffer stores or samples and in what order,
how much randomness it draws, the learner) fails here. If the change is meant, regenerate and commit
docs/dqn_cartpole_short.json, docs/dqn_cartpole.json and docs/dqn_cartpole.png with ``make train``.

The bits are those of x86-64 with MKL (``MKL_CBWR=COMPATIBLE``, set by tests/conftest.py and by the example) and
torch's AVX2 or AVX-512 kernels: elsewhere (ARM, another BLAS) matrix products round differently and the test
is skipped, saying so. The buffer's share of the wall time is measured, never compared.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.support import loaded_script

pytest.importorskip("gymnasium")
pytest.importorskip("tqdm")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dqn_cartpole.py"
DOCS = ROOT / "docs"
REGENERATE = "if the change is meant, run `make train` and commit docs/dqn_cartpole_short.json, .json and .png"
#: What a run computes, compared exactly (the wall time and the buffer's share are left out: they vary).
DETERMINISTIC = ("seed", "total_steps", "episodes", "window", "mean_return", "gradient_steps", "q_network_sha256")


def load(name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((DOCS / name).read_text())
    return record


def same_numerics_as(reference: dict[str, Any]) -> str | None:
    """Why this machine cannot reproduce the reference's bits, or ``None`` when it can."""
    numerics = reference["numerics"]
    here = (platform.machine(), "mkl" if torch.backends.mkl.is_available() else "other")
    if here != (numerics["machine"], numerics["blas"]):
        return f"the reference was computed on {numerics['machine']} with {numerics['blas']}; this is {here}"
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return "torch runs its unvectorized CPU kernels here (no AVX2), which sum in another order"
    return None


@pytest.fixture(scope="module")
def dqn() -> Iterator[ModuleType]:
    with loaded_script(EXAMPLE, "dqn_cartpole_main_job") as module:
        yield module


@pytest.fixture(scope="module")
def rerun(dqn: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The short run, re-run now in this process, as ``--short-reference`` writes it."""
    path = tmp_path_factory.mktemp("main_job") / "short.json"
    dqn.main(["--short-reference", str(path)])
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def test_the_short_rerun_gives_the_committed_curve_bit_for_bit(rerun: dict[str, Any]) -> None:
    reference = load("dqn_cartpole_short.json")
    reason = same_numerics_as(reference)
    if reason:
        pytest.skip(f"bit-for-bit comparison needs the reference's numerics: {reason}")
    assert rerun["numerics"]["probe"] == reference["numerics"]["probe"], (
        "this process multiplies matrices with other rounding than the reference's (MKL_CBWR="
        f"{os.environ.get('MKL_CBWR')!r} here, {reference['numerics']['mkl_cbwr']!r} there: MKL reads it before "
        "its first call; tests/conftest.py sets it)"
    )
    assert rerun["args"] == reference["args"], f"SHORT_RUN changed since the reference was written: {REGENERATE}"
    assert rerun["episode_returns"] == reference["episode_returns"], f"the main job's curve moved: {REGENERATE}"
    assert rerun["episode_ends"] == reference["episode_ends"], f"the main job's curve moved: {REGENERATE}"
    assert {k: rerun[k] for k in DETERMINISTIC} == {k: reference[k] for k in DETERMINISTIC}, (
        f"the main job's final weights moved (same returns, other bits): {REGENERATE}"
    )


def test_the_committed_records_are_consistent() -> None:
    for name in ("dqn_cartpole.json", "dqn_cartpole_short.json"):
        record = load(name)
        returns = record["episode_returns"]
        assert record["episodes"] == len(returns) == len(record["episode_ends"]), name
        window = returns[-record["window"] :]
        assert record["mean_return"] == round(sum(window) / len(window), 1), name
        ends = record["episode_ends"]
        assert ends == sorted(ends) and ends[-1] <= record["total_steps"], name
    full = load("dqn_cartpole.json")
    assert full["plot"] == "docs/dqn_cartpole.png" and (ROOT / full["plot"]).is_file()
    # Both came from the same machine and versions (one `make train`), so the short test vouches for the full run.
    assert load("dqn_cartpole_short.json")["numerics"] == full["numerics"]


def test_make_train_writes_the_committed_records() -> None:
    """``make train`` is the one command the README names: it writes the figure, the numbers and the reference."""
    recipe = re.search(r"^train:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe is not None
    lines = recipe.group(1).split("\n")
    assert "\t$(PY) examples/dqn_cartpole.py --short-reference docs/dqn_cartpole_short.json" in lines
    assert "\t$(PY) examples/dqn_cartpole.py --plot docs/dqn_cartpole.png --summary docs/dqn_cartpole.json" in lines


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="the full main job takes minutes: set RUN_SLOW=1")
def test_the_full_run_gives_the_committed_curve_bit_for_bit(dqn: ModuleType, tmp_path: Path) -> None:
    reference = load("dqn_cartpole.json")
    reason = same_numerics_as(reference)
    if reason:
        pytest.skip(f"bit-for-bit comparison needs the reference's numerics: {reason}")
    dqn.main(["--no-progress", "--plot", "", "--summary", str(tmp_path / "run.json")])
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["episode_returns"] == reference["episode_returns"], f"the main job's curve moved: {REGENERATE}"
    assert {k: run[k] for k in DETERMINISTIC} == {k: reference[k] for k in DETERMINISTIC}
