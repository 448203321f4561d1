"""HerReplayBuffer on hand-built episodes: each strategy's goals, the recomputed reward, the her ratio, which
rows are drawn (finished episodes only, never across envs or the ring's seam), and bad arguments."""

from __future__ import annotations

import enum
import pickle
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import GoalSelectionStrategy, HerReplayBuffer
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError
from tests.her.episodes import REAL_GOAL, encoded_reward, her, row, write_episodes

LENGTHS = [3, 5, 1, 4]


def relabeled(batch: TensorDict) -> TensorDict:
    return batch[batch["desired_goal"].squeeze(1) != REAL_GOAL]


def bounds(episodes: list[int]) -> dict[int, tuple[int, int]]:
    """``episode -> (first row id, last row id)``."""
    out: dict[int, tuple[int, int]] = {}
    for row_id, episode in enumerate(episodes):
        out[episode] = (out.get(episode, (row_id, row_id))[0], row_id)
    return out


@pytest.mark.parametrize("strategy", ["final", "future", "episode"])
def test_each_strategy_relabels_with_a_goal_of_the_right_step(strategy: str) -> None:
    rb = her(64, n_sampled_goal=9, goal_selection_strategy=strategy)
    episodes = write_episodes(rb, LENGTHS, unfinished=3)
    ends = bounds(episodes)
    batch = relabeled(rb.sample(400))
    assert batch.shape[0] == 360
    for row_id, goal, episode in zip(
        batch["next_achieved_goal"][:, 0].tolist(),
        batch["desired_goal"][:, 0].tolist(),
        batch["episode"].tolist(),
        strict=True,
    ):
        first, last = ends[episode]
        if strategy == "final":
            assert goal == last
        elif strategy == "future":  # inclusive of the row itself, as SB3
            assert row_id <= goal <= last
        else:
            assert first <= goal <= last
    goals = set(batch["desired_goal"][:, 0].tolist())
    if strategy == "episode":  # goals before the row do occur: an episode's first row gets later goals too
        assert any(
            g < r
            for g, r in zip(
                batch["desired_goal"][:, 0].tolist(), batch["next_achieved_goal"][:, 0].tolist(), strict=True
            )
        )
    if strategy != "final":
        assert len(goals) == sum(LENGTHS)  # every step of every finished episode is some row's goal


def test_next_desired_goal_gets_the_same_goal_and_the_reward_is_recomputed_once() -> None:
    calls: list[tuple[torch.Tensor, torch.Tensor, Any]] = []

    def reward(achieved: torch.Tensor, desired: torch.Tensor, infos: Any) -> torch.Tensor:
        calls.append((achieved, desired, infos))
        return encoded_reward(achieved, desired, infos)

    rb = her(64, compute_reward=reward)
    write_episodes(rb, LENGTHS)
    batch = rb.sample(20)
    assert len(calls) == 1  # vectorised: one call for the whole batch
    achieved, desired, infos = calls[0]
    assert achieved.shape == desired.shape == (16, 1) and infos == [{}] * 16  # SB3's empty info dicts
    real, virtual = batch[:4], batch[4:]
    assert (real["desired_goal"] == REAL_GOAL).all() and (real["reward"] == -1).all()  # stored reward kept
    assert torch.equal(virtual["next_desired_goal"], virtual["desired_goal"])
    expected = 1000 * virtual["next_achieved_goal"][:, 0] + virtual["desired_goal"][:, 0]
    assert torch.equal(virtual["reward"], expected.float())
    # the done flags are the stored ones
    stored = rb.sample_by_index(batch["index"])
    assert torch.equal(batch["terminated"], stored["terminated"]) and torch.equal(
        batch["truncated"], stored["truncated"]
    )


@pytest.mark.parametrize(("n_sampled_goal", "batch_size", "virtual"), [(4, 100, 80), (4, 7, 5), (1, 9, 4), (0, 50, 0)])
def test_her_ratio_sets_how_many_rows_are_relabeled(n_sampled_goal: int, batch_size: int, virtual: int) -> None:
    called = []

    def reward(achieved: torch.Tensor, desired: torch.Tensor, infos: Any) -> torch.Tensor:
        called.append(achieved.shape[0])
        return encoded_reward(achieved, desired, infos)

    rb = her(64, n_sampled_goal=n_sampled_goal, compute_reward=reward)
    write_episodes(rb, [40])  # one long episode: a goal other than the row's own is likely
    assert rb.her_ratio == pytest.approx(1 - 1 / (n_sampled_goal + 1))
    batch = rb.sample(batch_size)
    assert int((batch["desired_goal"] != REAL_GOAL).sum()) == virtual
    assert (batch[: batch_size - virtual]["desired_goal"] == REAL_GOAL).all()
    assert called == ([virtual] if virtual else [])


def test_the_unfinished_episode_is_neither_drawn_nor_a_goal() -> None:
    rb = her(64, goal_selection_strategy="episode")
    with pytest.raises(EmptyBufferError, match="no episode has ended"):
        write_episodes(rb, [], unfinished=5)
        rb.sample(4)
    assert rb.sampleable_rows == 0
    rb.add(row(5, 0, 5, True))  # the episode ends: now all of it is drawn
    assert rb.sampleable_rows == 6
    rb.add(row(6, 1, 0, False))
    batch = rb.sample(300)
    assert batch["next_achieved_goal"].max() == 5 and batch["desired_goal"].max() == 5


def test_an_episode_whose_start_was_overwritten_is_never_drawn() -> None:
    rb = her(10, n_sampled_goal=3, goal_selection_strategy="episode")
    episodes = write_episodes(rb, [4, 4, 4])  # rows 0-11 in 10 slots: rows 2, 3 (episode 0) remain
    assert rb.sampleable_rows == 8
    batch = rb.sample(300)
    assert set(batch["episode"].tolist()) == {1, 2}
    ends = bounds(episodes)
    for goal, episode in zip(batch["desired_goal"][:, 0].tolist(), batch["episode"].tolist(), strict=True):
        assert goal == REAL_GOAL or ends[episode][0] <= goal <= ends[episode][1]


def test_before_the_ring_wraps_the_first_episode_is_drawn() -> None:
    rb = her(10)
    write_episodes(rb, [3, 2])
    assert rb.sampleable_rows == 5


def test_vector_envs_are_separate_streams() -> None:
    """Three envs with different episode lengths, written step by step: a goal is always from the row's
    own env and episode, and each env's unfinished tail is never used."""
    rb = her(60, num_envs=3, n_sampled_goal=9, goal_selection_strategy="future")
    lengths = [2, 3, 5]
    step = [0, 0, 0]
    episode = [0, 0, 0]
    for t in range(12):
        rows = []
        for env in range(3):
            end = step[env] == lengths[env] - 1
            rows.append(row(100 * env + t, 10 * env + episode[env], step[env], end))
            step[env], episode[env] = (0, episode[env] + 1) if end else (step[env] + 1, episode[env])
        rb.add(torch.stack([TensorDict(r, []) for r in rows]))
    # env 0: 6 episodes of 2 (rows t 0-11); env 1: 4 of 3; env 2: 2 of 5 (t 0-9), t 10, 11 unfinished
    assert rb.sampleable_rows == 12 + 12 + 10
    batch = relabeled(rb.sample(500))
    row_ids, goals = batch["next_achieved_goal"][:, 0], batch["desired_goal"][:, 0]
    assert torch.equal(row_ids // 100, goals // 100)  # the same env
    env_len = torch.tensor(lengths)[row_ids // 100]
    t, goal_t = row_ids % 100, goals % 100
    assert torch.equal(t // env_len, goal_t // env_len)  # the same episode
    finished = torch.tensor([12, 12, 10])[row_ids // 100]  # steps of each env whose episode ended
    assert (goal_t >= t).all() and (goal_t < finished).all()


def test_nested_goal_keys_and_info_keys() -> None:
    seen = []

    def reward(achieved: torch.Tensor, desired: torch.Tensor, infos: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        seen.extend(infos)
        return (achieved == desired).all(-1).float() - 1

    rb = her(
        32, compute_reward=reward, achieved_goal_key=("obs", "achieved"), desired_goal_key=("obs", "desired"),
        info_keys=["step"], goal_selection_strategy="final",
    )  # fmt: skip
    for t in range(4):
        goal = torch.tensor([float(t + 1), 0.0])
        obs = {"achieved": goal - 1, "desired": torch.zeros(2)}
        rb.add({"obs": obs, "next_obs": {"achieved": goal, "desired": torch.zeros(2)}, "reward": -1.0,
                "step": t, "terminated": False, "truncated": t == 3})  # fmt: skip
    assert rb.next_achieved_goal_key == ("next_obs", "achieved")
    batch = rb.sample(10)
    assert (batch["obs", "desired"][2:] == torch.tensor([4.0, 0.0])).all()
    assert (batch["next_obs", "desired"][2:] == torch.tensor([4.0, 0.0])).all()
    assert torch.equal(batch["reward"][2:], (batch["step"][2:] == 3).float() - 1)
    assert [int(info["step"]) for info in seen] == batch["step"][2:].tolist()


def test_same_seed_same_batches() -> None:
    first, second = her(64, seed=3), her(64, seed=3)
    write_episodes(first, LENGTHS)
    write_episodes(second, LENGTHS)
    assert (first.sample(32) == second.sample(32)).all()


class SB3Like(enum.Enum):  # Stable-Baselines3's GoalSelectionStrategy is an enum of these names
    FUTURE = 0
    FINAL = 1
    EPISODE = 2


@pytest.mark.parametrize(
    ("given", "expected"),
    [("future", "future"), ("FINAL", "final"), ("Episode", "episode"), (SB3Like.FINAL, "final"),
     (GoalSelectionStrategy.EPISODE, "episode")],
)  # fmt: skip
def test_strategy_names(given: Any, expected: str) -> None:
    assert her(8, goal_selection_strategy=given).goal_selection_strategy.value == expected


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"goal_selection_strategy": "past"}, "goal_selection_strategy"),
        ({"goal_selection_strategy": 1}, "goal_selection_strategy"),
        ({"n_sampled_goal": -1}, "n_sampled_goal"),
        ({"n_sampled_goal": 2.5}, "n_sampled_goal"),
        ({"n_sampled_goal": True}, "n_sampled_goal"),
        ({"compute_reward": None}, "compute_reward"),
        ({"desired_goal_key": 3}, "desired_goal_key"),
        ({"next_achieved_goal_key": ("a", 1)}, "next_achieved_goal_key"),
        ({"info_keys": "step"}, "info_keys"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=argument):
        her(8, **kwargs)


def test_missing_keys_are_named_and_change_nothing() -> None:
    rb = her(16, desired_goal_key="goal")
    write_episodes(rb, [3])
    with pytest.raises(SchemaError, match="desired_goal_key: the key 'goal'"):
        rb.sample(4)
    rb = her(16, next_desired_goal_key=None, info_keys=["nope"])
    write_episodes(rb, [3])
    with pytest.raises(SchemaError, match="info_keys: the key 'nope'"):
        rb.sample(4)
    rb = her(16, transition_keys=None, next_achieved_goal_key="observation")
    write_episodes(rb, [3])
    state = rb.generator.get_state()
    with pytest.raises(SchemaError, match=r"next_achieved_goal_key: .observation. stores .*float32"):
        rb.sample(4)
    assert len(rb) == 3 and torch.equal(rb.generator.get_state(), state)  # nothing drawn


def test_episode_end_keys_must_be_stored() -> None:
    rb = her(16)
    rb.add({"desired_goal": [0.0], "next_desired_goal": [0.0], "next_achieved_goal": [1.0], "reward": 0.0})
    with pytest.raises(SchemaError, match="terminated"):
        rb.sample(2)


def test_compute_reward_of_the_wrong_size_is_refused() -> None:
    rb = her(16, compute_reward=lambda a, d, i: [0.0])
    write_episodes(rb, [3])
    state = rb.generator.get_state()
    with pytest.raises(SchemaError, match="compute_reward returned"):
        rb.sample(10)
    assert torch.equal(rb.generator.get_state(), state)  # a failed sample draws nothing


@pytest.mark.parametrize("kwargs", [{"n_step": 3}, {"recent": 5}])
def test_n_step_and_recent_are_refused(kwargs: dict[str, int]) -> None:
    rb = her(16)
    write_episodes(rb, [3])
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        rb.sample_batch(4, **kwargs)


def test_it_is_a_replay_buffer() -> None:
    rb = her(16)
    write_episodes(rb, [3], unfinished=2)
    assert isinstance(rb, HerReplayBuffer) and len(rb) == 5
    assert rb.sample_all()["desired_goal"].eq(REAL_GOAL).all()  # other reads return the stored rows


def test_copies_and_checkpoints_keep_the_rows_and_take_the_settings(tmp_path: Any) -> None:
    rb = her(64, seed=1, goal_selection_strategy="final")
    write_episodes(rb, LENGTHS, unfinished=2)
    copied = pickle.loads(pickle.dumps(rb))
    assert copied.goal_selection_strategy is GoalSelectionStrategy.FINAL and copied.sampleable_rows == sum(LENGTHS)
    assert (copied.sample(16) == rb.sample(16)).all()
    rb.save(tmp_path / "her", data=True)
    loaded = HerReplayBuffer.from_checkpoint(tmp_path / "her", compute_reward=encoded_reward, n_sampled_goal=1)
    assert loaded.sampleable_rows == sum(LENGTHS) and loaded.her_ratio == 0.5
    assert (loaded.sample(10)["desired_goal"][:5] == REAL_GOAL).all()


def test_episodes_longer_than_the_search_window() -> None:
    """Episode ends are found in windows that double: episodes of hundreds of steps, an unfinished tail too."""
    rb = her(1024, goal_selection_strategy="final", n_sampled_goal=9)
    episodes = write_episodes(rb, [300, 5, 200], unfinished=150)
    assert rb.sampleable_rows == 505
    batch = relabeled(rb.sample(200))
    last = {e: b[1] for e, b in bounds(episodes).items()}
    assert [last[e] for e in batch["episode"].tolist()] == batch["desired_goal"][:, 0].tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("storing_device", ["cpu", "cuda"])
def test_on_an_accelerator(storing_device: str) -> None:
    rb = HerReplayBuffer("cuda", storing_device, 64, compute_reward=encoded_reward, seed=0, num_envs=1)
    episodes = write_episodes(rb, LENGTHS, unfinished=2)
    batch = rb.sample(50)
    assert batch.device == torch.device("cuda", 0) and batch["reward"].device.type == "cuda"
    ends = bounds(episodes)
    for row_id, goal, episode in zip(
        batch["next_achieved_goal"][10:, 0].tolist(), batch["desired_goal"][10:, 0].tolist(),
        batch["episode"][10:].tolist(), strict=True,
    ):  # fmt: skip
        assert row_id <= goal <= ends[episode][1]
