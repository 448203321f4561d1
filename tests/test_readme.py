"""The README's numbers come from the committed run. Its code blocks (and the docs pages') are run by
tests/docs/test_code_blocks.py."""

from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_the_main_jobs_numbers_come_from_the_committed_run() -> None:
    """The README quotes docs/dqn_cartpole.json, written by `make train` with docs/dqn_cartpole.png.

    Only what the run computes is compared (the same bits on every run: tests/test_main_job.py); its wall time
    and the buffer's share of it vary from run to run, so the README gives them as measured ranges, unchecked.
    """
    import json

    run = json.loads((README.parent / "docs" / "dqn_cartpole.json").read_text())
    text = README.read_text()
    assert run["plot"] == "docs/dqn_cartpole.png" and (README.parent / run["plot"]).is_file()
    assert "make train" in text
    assert f"trains for {run['total_steps']:,} env steps" in text
    assert f"(seed {run['seed']}: {run['mean_return']:.1f}, the bar is 195)" in text
    assert f"the last {run['window']} episodes" in text
    assert run["mean_return"] >= 195  # the run the README shows did solve CartPole


def test_the_readme_is_a_page_that_installs_from_a_clone() -> None:
    """A newcomer reads it in about five minutes (at most ~150 lines, ~1,000 words at 200 a minute), and its
    install commands work from a clone: the package is not on PyPI, so no `pip install objectrl_buffer[...]`."""
    import re

    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert len(text.split()) <= 1_200
    assert not re.search(r"pip install ['\"]?objectrl_buffer", text)
    assert 'pip install -e ".[' in text
