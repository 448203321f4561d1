"""The README's numbers come from the committed run. Its code blocks (and the docs pages') are run by
tests/docs/test_code_blocks.py."""

from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_the_main_jobs_numbers_come_from_the_committed_run() -> None:
    """The README quotes docs/dqn_cartpole.json, written by the run that drew docs/dqn_cartpole.png."""
    import json

    run = json.loads((README.parent / "docs" / "dqn_cartpole.json").read_text())
    text = README.read_text()
    assert run["plot"] == "docs/dqn_cartpole.png" and (README.parent / run["plot"]).is_file()
    assert f"trains for {run['total_steps']:,} env steps ({run['wall_s']:.0f} s" in text
    assert f"(seed {run['seed']}: {run['mean_return']:.1f}, the bar is 195)" in text
    assert f"the last {run['window']} episodes" in text
    assert f"wall time the buffer took ({run['buffer_share_percent']}%)" in text
    assert run["mean_return"] >= 195  # the run the README shows did solve CartPole
