"""Relabeled goals and drawn rows follow the strategy's distribution: chi-square goodness of fit at a fixed seed.

Each relabeled row of step ``t`` in an episode of ``T`` steps gets its goal from step ``j``: ``future``
uniform over ``t <= j < T`` (SB3's inclusive future), ``episode`` uniform over ``0 <= j < T``. The rows
themselves are drawn uniformly among the rows of finished episodes. The p-value comes from the chi-square
survival function (``torch.special.gammaincc``); a wrong distribution (an exclusive future, goals from the
whole episode, a row of the unfinished episode) gives p below 1e-10 at these sample sizes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from tests.her.episodes import REAL_GOAL, her, write_episodes

LENGTHS = [3, 7, 5, 1]


def chi_square(observed: Mapping[Any, int], expected: Mapping[Any, float]) -> float:
    """Pearson's statistic of ``observed`` counts against ``expected`` ones; every observed cell must be allowed."""
    assert set(observed) <= set(expected), f"counts outside the allowed cells: {set(observed) - set(expected)}"
    return sum((observed.get(cell, 0) - e) ** 2 / e for cell, e in expected.items())


def survival(chi2: float, dof: int) -> float:
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(chi2 / 2, dtype=torch.float64))
    )


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_relabeled_goal_steps_are_uniform_over_the_allowed_steps(strategy: str) -> None:
    rb = her(64, n_sampled_goal=19, goal_selection_strategy=strategy, seed=7)
    episodes = write_episodes(rb, LENGTHS, unfinished=4)
    first = torch.tensor([episodes.index(e) for e in range(len(LENGTHS))])
    cells = []
    for _ in range(20):  # batches of 500: each search stays below torch's parallel grain
        batch = rb.sample(500)
        virtual = batch[batch["desired_goal"][:, 0] != REAL_GOAL]
        start = first[virtual["episode"]]
        t, j = virtual["next_achieved_goal"][:, 0] - start, virtual["desired_goal"][:, 0] - start
        cells.append(virtual["episode"] * 100 + t * 10 + j)  # episodes of at most 10 steps
    pairs = Counter({(c // 100, c // 10 % 10, c % 10): n for c, n in Counter(torch.cat(cells).tolist()).items()})
    assert sum(pairs.values()) >= 9_000
    expected: dict[tuple[int, ...], float] = {}
    dof = 0
    for episode, length in enumerate(LENGTHS):
        for t in range(length):
            n_t = sum(c for (e, s, _), c in pairs.items() if (e, s) == (episode, t))
            allowed = range(t, length) if strategy == "future" else range(length)
            for j in allowed:
                expected[(episode, t, j)] = n_t / len(allowed)
            dof += len(allowed) - 1
    chi2 = chi_square(dict(pairs), expected)
    assert survival(chi2, dof) > 1e-3, (chi2, dof)


def test_rows_are_drawn_uniformly_among_the_finished_episodes() -> None:
    rb = her(64, n_sampled_goal=1, seed=11)
    write_episodes(rb, LENGTHS, unfinished=4)
    counts = Counter(torch.cat([rb.sample(1000)["index"] for _ in range(10)]).tolist())
    drawable = sum(LENGTHS)
    expected = {slot: 10_000 / drawable for slot in range(drawable)}  # never the unfinished rows
    assert survival(chi_square(dict(counts), expected), drawable - 1) > 1e-3


def test_the_statistic_rejects_an_exclusive_future() -> None:
    """The test above can fail: goals drawn from ``(t, T)`` instead of ``[t, T)`` are far off."""
    observed = {(0, 0): 500, (0, 1): 500}
    expected = {(0, 0): 1000 / 3, (0, 1): 1000 / 3, (0, 2): 1000 / 3}
    assert survival(chi_square(observed, expected), 2) < 1e-10
