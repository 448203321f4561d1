"""DQN on CartPole-v1 with gymnasium.make_vec: several envs step together into one num_envs= buffer, in one file.

CleanRL's layout (one file, arguments at the top, one loop you can read from start to end), with the replay
buffer of this library instead of a hand-written one:

* ``gymnasium.make_vec(env_id, num_envs=N)`` steps ``N`` copies of the env at once, with gymnasium's
  ``SAME_STEP`` autoreset: an env that ends is reset in the same ``step``, which returns the reset
  observation and puts the last one in ``infos["final_obs"]``. That one is the ``next_state`` stored, so no
  row ever goes from an episode's end to the next episode's start;
* ``ReplayBuffer("cpu", "cpu", buffer_size, num_envs=N)`` takes each vector step as one ``add`` of ``N``
  rows (arrays of ``[N, ...]``, straight from the env): env ``e`` of the step is its own stream, so n-step
  returns, slices and ``sample_all()`` (``[T, N]``) never mix envs;
* every ``--train-frequency`` vector steps after ``--learning-starts`` env steps, one gradient step of a DQN
  (a target network copied every ``--target-network-frequency`` env steps, or Polyak-averaged with
  ``--tau`` < 1) on ``memory.sample_batch(--batch-size)``.

Epsilon decays linearly from ``--start-e`` to ``--end-e`` over ``--exploration-fraction`` of the run.
Steps are counted in env steps (transitions): a vector step of ``N`` envs is ``N`` of them. One run with the
defaults (seed 1, 4 envs, 100,000 env steps, 160 s on a busy 2-core machine) ended with a mean return of 284.4
over the last 20 episodes (epsilon 0.05 still on), above CartPole's "solved" level of 195.

    python examples/cleanrl_dqn_vec.py                      # 4 envs, 100,000 env steps
    python examples/cleanrl_dqn_vec.py --num-envs 8 --vectorization-mode async

The last line printed is ``mean return over last 20 episodes: X``; ``main()`` returns a :class:`Result`
(that mean, the episode count, the gradient steps and the buffer).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from objectrl_buffer import ReplayBuffer

LAST_EPISODES = 20  # the mean return printed and returned is over this many last episodes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env-id", default="CartPole-v1", help="gymnasium id of an env with a Box observation and "
                   "Discrete actions")  # fmt: skip
    p.add_argument("--num-envs", type=int, default=4, help="envs stepped together by gymnasium.make_vec")
    p.add_argument(
        "--vectorization-mode", choices=["sync", "async"], default="sync",
        help="make_vec's mode: sync (one process) or async (one subprocess per env)",
    )  # fmt: skip
    p.add_argument("--total-timesteps", type=int, default=100_000, help="env steps of the run, over all envs")
    p.add_argument("--buffer-size", type=int, default=20_000, help="rows the buffer holds (a multiple of --num-envs)")
    p.add_argument("--learning-rate", type=float, default=5e-4, help="Adam's learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--tau", type=float, default=1.0, help="target network update rate (1: a plain copy)")
    p.add_argument("--target-network-frequency", type=int, default=500, help="env steps between target network updates")
    p.add_argument("--batch-size", type=int, default=128, help="rows per gradient step")
    p.add_argument("--start-e", type=float, default=1.0, help="epsilon at the start")
    p.add_argument("--end-e", type=float, default=0.05, help="epsilon at the end of the decay and after it")
    p.add_argument(
        "--exploration-fraction", type=float, default=0.5, help="share of --total-timesteps over which epsilon decays"
    )
    p.add_argument("--learning-starts", type=int, default=5_000, help="env steps before the first gradient step")
    p.add_argument("--train-frequency", type=int, default=2, help="vector steps between gradient steps")
    p.add_argument("--hidden", type=int, default=120, help="width of the Q-network's two hidden layers")
    p.add_argument("--seed", type=int, default=1, help="seed of the envs, the network, exploration and the buffer")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--log-every", type=int, default=10_000, help="env steps between progress lines (0: none)")
    args = p.parse_args(argv)
    for name in ("num_envs", "total_timesteps", "buffer_size", "batch_size", "train_frequency", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.buffer_size % args.num_envs:
        p.error(f"--buffer-size ({args.buffer_size}) must be a multiple of --num-envs ({args.num_envs})")
    if not 0.0 < args.tau <= 1.0:
        p.error(f"--tau must be in (0, 1], got {args.tau}")
    return args


@dataclass
class Result:
    """What a run produced."""

    mean_return: float  # over the last LAST_EPISODES finished episodes (nan if none finished)
    episodes: int  # finished episodes, over all envs
    gradient_steps: int
    memory: ReplayBuffer  # the buffer, as the run left it


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    """Epsilon at env step ``t``: from ``start_e`` down to ``end_e`` over ``duration`` steps, then ``end_e``."""
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


def main(argv: list[str] | None = None) -> Result:
    args = parse_args(argv)  # --help and argument errors answer here, before torch and gymnasium load
    import gymnasium as gym
    import numpy as np
    import torch
    from torch import nn

    from objectrl_buffer import ReplayBuffer

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)  # exploration

    n = args.num_envs
    envs = gym.make_vec(
        args.env_id, num_envs=n, vectorization_mode=args.vectorization_mode,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )  # fmt: skip
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(observation_space, gym.spaces.Box) or not isinstance(action_space, gym.spaces.Discrete):
        envs.close()
        raise SystemExit(f"{args.env_id}: DQN needs a Box observation and Discrete actions")
    obs_dim, n_actions = int(np.prod(observation_space.shape)), int(action_space.n)

    def q_net() -> nn.Module:
        return nn.Sequential(
            nn.Linear(obs_dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden // 2), nn.ReLU(),
            nn.Linear(args.hidden // 2, n_actions),
        )  # fmt: skip

    q_network, target_network = q_net(), q_net()
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    memory = ReplayBuffer("cpu", "cpu", args.buffer_size, num_envs=n, seed=args.seed)

    episode_return, episode_returns = np.zeros(n), []
    gradient_steps, started, next_log = 0, time.perf_counter(), args.log_every
    obs, _ = envs.reset(seed=args.seed)
    for iteration in range(args.total_timesteps // n):
        global_step = iteration * n  # env steps taken before this vector step
        epsilon = linear_schedule(
            args.start_e, args.end_e, int(args.exploration_fraction * args.total_timesteps), global_step
        )
        with torch.no_grad():
            greedy = q_network(torch.as_tensor(obs, dtype=torch.float32)).argmax(1).numpy()
        actions = np.where(rng.random(n) < epsilon, rng.integers(0, n_actions, n), greedy)

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()  # SAME_STEP autoreset: an ended env's last observation is in final_obs
        for e in np.flatnonzero(terminations | truncations):
            real_next_obs[e] = infos["final_obs"][e]
        memory.add({
            "state": obs, "action": actions, "reward": rewards.astype(np.float32), "next_state": real_next_obs,
            "terminated": terminations, "truncated": truncations,
        })  # fmt: skip
        obs = next_obs

        episode_return += rewards
        for e in np.flatnonzero(terminations | truncations):
            episode_returns.append(float(episode_return[e]))
            episode_return[e] = 0.0

        if global_step >= args.learning_starts and iteration % args.train_frequency == 0:
            batch = memory.sample_batch(args.batch_size)
            with torch.no_grad():
                target_max = target_network(batch["next_state"]).max(1).values
                alive = 1.0 - batch["terminated"].float()
                td_target = batch["reward"] + args.gamma * alive * target_max
            q = q_network(batch["state"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
            loss = nn.functional.mse_loss(q, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            gradient_steps += 1
        # the target network: every --target-network-frequency env steps (crossed during this vector step)
        if global_step >= args.learning_starts and (global_step + n) // args.target_network_frequency > (
            global_step // args.target_network_frequency
        ):
            with torch.no_grad():
                for p_target, p in zip(target_network.parameters(), q_network.parameters(), strict=True):
                    p_target.mul_(1.0 - args.tau).add_(p, alpha=args.tau)

        if args.log_every and global_step + n >= next_log:
            next_log += args.log_every
            recent = episode_returns[-LAST_EPISODES:]
            mean = sum(recent) / len(recent) if recent else float("nan")
            print(
                f"step {global_step + n}/{args.total_timesteps}: {len(episode_returns)} episodes, mean return of "
                f"the last {LAST_EPISODES} {mean:.1f}, epsilon {epsilon:.2f}, {len(memory)} rows, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
    envs.close()
    recent = episode_returns[-LAST_EPISODES:]
    mean_return = sum(recent) / len(recent) if recent else float("nan")
    print(f"{n} envs, {len(episode_returns)} episodes, {gradient_steps} gradient steps, {len(memory)} rows "
          f"(capacity {memory.buffer_size}), {time.perf_counter() - started:.1f} s")  # fmt: skip
    print(f"mean return over last {LAST_EPISODES} episodes: {mean_return:.1f}")
    return Result(mean_return, len(episode_returns), gradient_steps, memory)


if __name__ == "__main__":
    main()
