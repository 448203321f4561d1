"""End to end: the PPO cycle and the off-policy learn loop, as ObjectRL's agents drive the buffer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from tests.support import OBS_DIM, PPO_KEYS, fill, objectrl_transition, steps_of

Factory = Callable[..., ReplayBuffer]

GAMMA, LAMBDA = 0.9, 0.8


def reference_gae(rows: list[TensorDict]) -> tuple[list[float], list[float]]:
    """Backward GAE over transitions in time order, in plain Python floats."""
    advantages = [0.0] * len(rows)
    last = 0.0
    for t in reversed(range(len(rows))):
        r = rows[t]
        not_done = 1.0 - float(r["terminated"])
        delta = float(r["reward"]) + GAMMA * float(r["next_state_value"]) * not_done - float(r["value"])
        last = delta + GAMMA * LAMBDA * not_done * last
        advantages[t] = last
    returns = [a + float(r["value"]) for a, r in zip(advantages, rows, strict=True)]
    return advantages, returns


def calculate_gae(rb: ReplayBuffer) -> None:
    """What PPO's ``calculate_GAE_estimates`` does with the buffer: sample_all, GAE, reset, add_batch."""
    batch = rb.sample_all()
    n = batch.batch_size[0]
    not_done = 1.0 - batch["terminated"]
    deltas = batch["reward"] + GAMMA * batch["next_state_value"] * not_done - batch["value"]
    advantages = torch.zeros(n)
    last = torch.tensor(0.0)
    for t in reversed(range(n)):
        last = deltas[t] + GAMMA * LAMBDA * not_done[t] * last
        advantages[t] = last
    batch["advantages"] = advantages
    batch["returns"] = advantages + batch["value"]
    rb.reset()
    rb.add_batch(TensorDict(dict(batch), batch_size=[n]))  # carries "index": must be ignored


@pytest.mark.parametrize("rollout", [7, 10, 25], ids=lambda n: f"rollout{n}")
def test_ppo_cycle_keeps_time_order_and_new_keys(make_buffer: Factory, rollout: int) -> None:
    rb = make_buffer(10)
    first_step = 0
    for _cycle in range(3):
        steps = range(first_step, first_step + rollout)
        fill(rb, steps, ppo=True)
        kept = [objectrl_transition(s, ppo=True) for s in steps][-10:]  # the newest rows, oldest first
        expected_adv, expected_ret = reference_gae(kept)
        by_step = {int(r["step"]): (a, g) for r, a, g in zip(kept, expected_adv, expected_ret, strict=True)}

        calculate_gae(rb)
        assert len(rb) == len(kept) and rb.pointer == len(kept) % 10
        assert {f.key for f in rb.schema.fields} >= {"advantages", "returns", *PPO_KEYS}  # type: ignore[union-attr]
        assert "index" not in {f.key for f in rb.schema.fields}  # type: ignore[union-attr]
        assert steps_of(rb.sample_all()) == [int(r["step"]) for r in kept]

        n_steps = rb.get_steps_and_iterator(n_epochs=2, max_iter=1000, batch_size=4)
        assert n_steps == 2 * -(-len(kept) // 4)
        seen: list[int] = []
        for _ in range(n_steps):
            batch = rb.get_next_batch(4)
            for step, adv, ret in zip(steps_of(batch), batch["advantages"], batch["returns"], strict=True):
                assert adv.item() == pytest.approx(by_step[step][0], rel=1e-5, abs=1e-5)
                assert ret.item() == pytest.approx(by_step[step][1], rel=1e-5, abs=1e-5)
                seen.append(step)
            assert batch["state"].shape[1:] == (OBS_DIM,) and batch["action_logprob"].dim() == 1
        assert sorted(seen) == sorted(2 * list(by_step))  # each row once per epoch

        rb.reset()  # PPO resets again after learning: the next rollout has no advantages/returns
        assert len(rb) == 0 and rb.schema is None
        first_step += rollout


def test_ppo_learn_with_fewer_rows_than_a_batch(make_buffer: Factory) -> None:
    rb = make_buffer(64)
    fill(rb, range(3), ppo=True)
    calculate_gae(rb)
    assert rb.get_steps_and_iterator(n_epochs=1, max_iter=10, batch_size=8) == 1
    assert rb.get_next_batch(8).batch_size == (3,)
    rb.get_steps_and_iterator(n_epochs=0, max_iter=10, batch_size=8)
    assert rb.get_next_batch(8).batch_size == (8,)  # random sampling with replacement


def test_off_policy_learn_loop(make_buffer: Factory) -> None:
    """ObjectRL's control loop: add every env step; every 4 steps a learn call of max_iter gradient steps."""
    rb = make_buffer(50, seed=11)
    batch_size, learn_every, max_iter = 16, 4, 3
    gradient_steps = 0
    for step in range(200):
        rb.add(objectrl_transition(step))
        if step % learn_every or len(rb) < batch_size:
            continue
        n = rb.get_steps_and_iterator(n_epochs=0, max_iter=max_iter, batch_size=batch_size)
        for _ in range(n):
            batch = rb.get_next_batch(batch_size)
            assert batch.batch_size == (batch_size,)
            assert torch.equal(batch["next_state"], batch["state"] + 1)
            assert all(step - 50 < s <= step for s in steps_of(batch))  # only the 50 newest rows
            gradient_steps += 1
    assert gradient_steps == max_iter * len([s for s in range(200) if s % learn_every == 0 and s >= batch_size - 1])
    assert (len(rb), rb.pointer) == (50, 0)


def test_gymnasium_rollout_with_plain_dicts(make_buffer: Factory) -> None:
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    rb = make_buffer(100)
    obs, _ = env.reset(seed=0)
    for _ in range(150):
        action = int(env.action_space.sample())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rb.add(
            {
                "state": obs,
                "action": action,
                "reward": float(reward),
                "next_state": next_obs,
                "terminated": float(terminated),
                "truncated": float(truncated),
            }
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    assert (len(rb), rb.pointer) == (100, 50)
    sample = rb.sample_batch(32)
    assert sample["state"].shape == (32, 4) and sample["state"].dtype == torch.float32
    assert sample["action"].dtype == torch.int64 and set(sample["action"].tolist()) <= {0, 1}
    assert torch.all(sample["reward"] == 1.0)


def test_dqn_warm_up_then_policy_actions(make_buffer: Factory) -> None:
    """ObjectRL's DQN (issue 9): warm-up stores random actions as float32 scalars, its policy then int64 ``[1]``
    tensors. Upstream's storage casts and reshapes them; so must we, keeping every value, warning once."""
    from objectrl_buffer.errors import CastWarning

    rb = make_buffer(50, seed=3)
    warm_up, total, batch_size = 30, 90, 16

    def action_of(step: int) -> int:
        return (step * 7) % 3  # the discrete action taken at ``step``

    with pytest.warns(CastWarning, match="key 'action'") as record:
        for step in range(total):
            transition = objectrl_transition(step)
            if step < warm_up:  # env.action_space.sample() through torch: a float32 scalar
                transition["action"] = torch.tensor(float(action_of(step)))
            else:  # argmax of the Q-network, shape [1], int64
                transition["action"] = torch.tensor([action_of(step)])
            rb.add(transition)
            if step >= warm_up:
                rb.get_steps_and_iterator(n_epochs=0, max_iter=1, batch_size=batch_size)
                batch = rb.get_next_batch(batch_size)
                assert batch["action"].shape == (batch_size,) and batch["action"].dtype == torch.float32
                assert batch["action"].tolist() == [float(action_of(s)) for s in steps_of(batch)]
    assert len(record) == 1  # once per key, not once per step
    assert rb.schema.by_key["action"].shape == () and len(rb) == 50
    everything = rb.sample_all()
    assert everything["action"].tolist() == [float(action_of(s)) for s in range(total - 50, total)]
