"""PPO on a gymnasium vector env (CartPole-v1), rollouts stored through objectrl_buffer's TrajectoryReplayBuffer.

The buffer is used as RLinf's embodied trainers use theirs:

* every iteration, ``B`` environments run ``T`` steps; the rollout becomes one ``Trajectory`` with tensors
  ``[T, B, ...]`` (``curr_obs``/``next_obs`` dicts, actions, rewards, dones, prev_logprobs, prev_values, and the
  GAE advantages and returns in ``forward_inputs``), added with ``buffer.add_trajectories([trajectory])``;
* the learner then draws ``--chunks`` transitions per gradient step with ``buffer.sample(num_chunks)``, from
  the newest ``--window`` trajectories (1: on-policy PPO; larger: reuse of slightly stale rollouts);
* ``--storage-dir`` also persists every rollout in the background (RLinf's folder format), loadable with
  ``objectrl-buffer trajectories sample --load-path DIR``.

    python examples/trajectory_ppo.py                       # a few minutes on one CPU core
    python examples/trajectory_ppo.py --storage-dir runs/ppo_rollouts --capacity 200000

Prints the mean return of the last 20 finished episodes and the time so far after every iteration, and a
summary at the end.
"""

from __future__ import annotations

import argparse
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1, help="seeds torch, the envs and the buffer")
    p.add_argument("--iterations", type=int, default=150, help="rollouts collected (and learned from)")
    p.add_argument("--T", type=int, default=128, help="steps per rollout")
    p.add_argument("--B", type=int, default=8, help="parallel environments")
    p.add_argument("--window", type=int, default=1, help="sample from the newest N rollouts (0: all)")
    p.add_argument("--chunks", type=int, default=256, help="transitions per gradient step")
    p.add_argument("--updates", type=int, default=16, help="gradient steps per iteration")
    p.add_argument("--lr", type=float, default=2.5e-3, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--lam", type=float, default=0.95, help="GAE lambda")
    p.add_argument("--clip", type=float, default=0.2, help="PPO's ratio clip epsilon")
    p.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="transitions kept (default: the newest --window rollouts; every one with --storage-dir or --window 0)",
    )
    p.add_argument("--storage-dir", default=None, help="persist rollouts here (RLinf's folder format)")
    return p.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and argument errors answer here, before torch and gymnasium load (seconds)

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from objectrl_buffer.trajectory import Trajectory, TrajectoryReplayBuffer


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        h = self.body(obs)
        return torch.distributions.Categorical(logits=self.pi(h)), self.v(h).squeeze(-1)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Advantages ``[T, B]`` (generalized advantage estimation; ``dones[t]`` ends the episode after step t)."""
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[0])):
        next_value = last_value if t == rewards.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t].float()
        delta = rewards[t] + gamma * next_value * alive - values[t]
        running = delta + gamma * lam * alive * running
        adv[t] = running
    return adv


def main(argv: list[str] | None = None) -> float:
    """Train; return the mean return of the last 20 finished episodes (0 if none finished)."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(args.B)])
    obs_np, _ = envs.reset(seed=args.seed)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    assert obs_space.shape is not None and isinstance(action_space, gym.spaces.Discrete)
    agent = ActorCritic(obs_space.shape[0], int(action_space.n))
    optim = torch.optim.Adam(agent.parameters(), lr=args.lr)
    buffer = TrajectoryReplayBuffer(
        seed=args.seed,
        sample_window_size=args.window,
        storage_dir=args.storage_dir,
        save_trajectories=args.storage_dir is not None,
        capacity=args.capacity,
    )
    episode_returns: list[float] = []
    running = np.zeros(args.B)
    start = time.perf_counter()
    try:
        for it in range(args.iterations):
            obs = torch.as_tensor(obs_np, dtype=torch.float32)
            steps: dict[str, list[torch.Tensor]] = {k: [] for k in ("obs", "next", "act", "rew", "done", "logp", "val")}
            with torch.no_grad():
                for _ in range(args.T):
                    dist, value = agent(obs)
                    action = dist.sample()
                    obs_np, reward, terminated, truncated, _ = envs.step(action.numpy())
                    next_obs = torch.as_tensor(obs_np, dtype=torch.float32)
                    running += reward
                    done = np.logical_or(terminated, truncated)
                    for b in np.flatnonzero(done):
                        episode_returns.append(float(running[b]))
                        running[b] = 0.0
                    rew = torch.as_tensor(reward, dtype=torch.float32)
                    values = (obs, next_obs, action, rew, torch.as_tensor(terminated), dist.log_prob(action), value)
                    for key, v in zip(steps, values, strict=True):
                        steps[key].append(v)
                    obs = next_obs
                _, last_value = agent(obs)
            rollout = {k: torch.stack(v) for k, v in steps.items()}  # each [T, B, ...]
            adv = gae(rollout["rew"], rollout["val"], rollout["done"], last_value, args.gamma, args.lam)
            buffer.add_trajectories(
                [
                    Trajectory(
                        max_episode_length=500,
                        model_weights_id=f"ppo_{it}",
                        actions=rollout["act"],
                        rewards=rollout["rew"],
                        terminations=rollout["done"],
                        dones=rollout["done"],
                        prev_logprobs=rollout["logp"],
                        prev_values=rollout["val"],
                        curr_obs={"state": rollout["obs"]},
                        next_obs={"state": rollout["next"]},
                        forward_inputs={"advantages": adv, "returns": adv + rollout["val"]},
                    )
                ]
            )
            for _ in range(args.updates):
                batch = buffer.sample(args.chunks)
                dist, value = agent(batch["curr_obs", "state"])
                a = batch["forward_inputs", "advantages"]
                a = (a - a.mean()) / (a.std() + 1e-8)
                ratio = (dist.log_prob(batch["actions"]) - batch["prev_logprobs"]).exp()
                pg = -torch.min(ratio * a, ratio.clamp(1 - args.clip, 1 + args.clip) * a).mean()
                v_loss = 0.5 * (value - batch["forward_inputs", "returns"]).pow(2).mean()
                loss = pg + 0.5 * v_loss - 0.01 * dist.entropy().mean()
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optim.step()
            recent = episode_returns[-20:]
            print(
                f"iteration {it + 1}/{args.iterations}: mean return (last 20 episodes) "
                f"{np.mean(recent) if recent else 0:.1f}, {time.perf_counter() - start:.1f} s",
                flush=True,  # progress as it comes, also when piped
            )
        buffer.flush()
        stats = buffer.get_stats()
    finally:
        buffer.close()
        envs.close()
    recent = episode_returns[-20:]
    score = float(np.mean(recent)) if recent else 0.0
    print(
        f"done: {stats['num_trajectories']} rollouts / {stats['total_samples']} transitions stored, "
        f"mean return {score:.1f}, {time.perf_counter() - start:.1f} s"
    )
    return score


if __name__ == "__main__":
    main()
