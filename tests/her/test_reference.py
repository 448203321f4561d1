"""HerReplayBuffer against a plain Python model of the rows written: random episode ends, envs, ring wraps.

The model knows every row's env, episode and step. The rows HER may draw are SB3's: those of finished
episodes whose first row is still held; once the ring has wrapped, an episode starting at its env's oldest
held row is left out too (the buffer cannot tell it from a cut one). Every sampled row must be such a row,
and every goal the next achieved goal of a held row of the same env and episode, at the step the strategy
allows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from objectrl_buffer.sampling import her as her_sampling
from tests.her.episodes import REAL_GOAL, her, row


@st.composite
def programs(draw: st.DrawFn) -> tuple[int, int, list[list[bool]], list[int], str, int]:
    envs = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 8))  # ring capacity in steps of every env
    ends = draw(st.lists(st.lists(st.booleans(), min_size=envs, max_size=envs), min_size=1, max_size=30))
    chunks = draw(st.lists(st.integers(1, 5), min_size=1, max_size=len(ends)))
    strategy = draw(st.sampled_from(["future", "final", "episode"]))
    window = draw(st.sampled_from([1, 2, her_sampling.FIRST_WINDOW]))  # small: the searches take many rounds
    return envs, steps, ends, chunks, strategy, window


@settings(max_examples=60, deadline=None)
@given(programs())
def test_draws_and_goals_match_the_model(program: tuple[int, int, list[list[bool]], list[int], str, int]) -> None:
    envs, steps, ends, chunks, strategy, window = program
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(her_sampling, "FIRST_WINDOW", window)
        check(envs, steps, ends, chunks, strategy)


def check(envs: int, steps: int, ends: list[list[bool]], chunks: list[int], strategy: str) -> None:
    rb = her(steps * envs, num_envs=envs, goal_selection_strategy=strategy, n_sampled_goal=3)
    # the model: (env, episode, step) of every row, by row id (write order)
    rows: list[tuple[int, int, int]] = []
    episode, step = [0] * envs, [0] * envs
    transitions = []
    for flags in ends:
        for env, end in enumerate(flags):
            rows.append((env, episode[env], step[env]))
            transitions.append(TensorDict(row(len(rows) - 1, 1000 * env + episode[env], step[env], end), []))
            episode[env], step[env] = (episode[env] + 1, 0) if end else (episode[env], step[env] + 1)
    # writes: add() of one env step or add_batch() of several, [T, envs]
    stacked = torch.stack(transitions).reshape(len(ends), envs)
    at = 0
    for size in [*chunks, len(ends)]:
        chunk = stacked[at : at + size]
        at += chunk.shape[0]
        if chunk.shape[0] == 1:
            rb.add(chunk[0] if envs > 1 else chunk[0, 0])
        elif chunk.shape[0]:
            rb.add_batch(chunk if envs > 1 else chunk[:, 0])
    assert at == len(ends)

    held = set(range(max(0, len(rows) - steps * envs), len(rows)))
    by_episode: dict[tuple[int, int], list[int]] = {}
    for row_id, (env, ep, _) in enumerate(rows):
        by_episode.setdefault((env, ep), []).append(row_id)
    finished = {key for key, ids in by_episode.items() if ends[ids[-1] // envs][key[0]]}
    wrapped = len(rows) >= steps * envs
    oldest = {env: min(r for r in held if rows[r][0] == env) for env in range(envs)}
    drawable = {
        key for key in finished
        if by_episode[key][0] in held and not (wrapped and by_episode[key][0] == oldest[key[0]])
    }  # fmt: skip
    expected = {r for key in drawable for r in by_episode[key]}
    assert rb.sampleable_rows == len(expected)
    if not expected:
        return
    batch = rb.sample(64)
    for row_id, goal in zip(
        batch["next_achieved_goal"][:, 0].tolist(), batch["desired_goal"][:, 0].tolist(), strict=True
    ):
        assert row_id in expected
        if goal == REAL_GOAL:
            continue
        env, ep, s = rows[row_id]
        assert goal in held and rows[goal][:2] == (env, ep)  # same env, same episode, never past the write head
        goal_step = rows[goal][2]
        if strategy == "final":
            assert goal == by_episode[(env, ep)][-1]
        elif strategy == "future":
            assert goal_step >= s
