"""DQN with hindsight experience replay on bit flipping (Andrychowicz et al. 2017, Fig. 1), one file.

The environment: a state of ``n`` bits and a goal of ``n`` bits, both random; action ``i`` flips bit ``i``;
the reward is -1 on every step that does not reach the goal and 0 on the one that does (the episode then
terminates); an episode is cut after ``n`` steps. With more than ~10 bits a random policy almost never
sees a reward of 0, so plain DQN learns nothing; relabeling goals in hindsight
(:class:`objectrl_buffer.HerReplayBuffer`) gives it the reward signal.

``--envs`` bit-flipping envs run side by side as one batch of tensors (an env that ends is reset at
once); each step of all of them is one ``add`` of ``[envs]`` rows (the buffer keeps each env's stream
apart, ``num_envs``). The keys follow gymnasium's goal envs: ``observation``, ``achieved_goal`` (equal
here), ``desired_goal``, their ``next_`` twins, ``action``, ``reward``, ``terminated``, ``truncated``.
After every cycle of ``--steps-per-cycle`` env steps, ``--updates`` gradient steps of a DQN (Double DQN
targets clipped to ``[-1 / (1 - gamma), 0]``, Polyak-averaged target network, as the paper) on batches
of ``--batch-size``. The success rate is measured with the greedy policy on ``--eval-episodes`` fresh
episodes.

    python examples/her_bit_flipping.py --bits 15              # DQN + HER ("future", n_sampled_goal=4)
    python examples/her_bit_flipping.py --bits 15 --no-her     # plain DQN on the same data (n_sampled_goal=0)

The last line printed is ``final success rate: X.XX``; ``main()`` returns X.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--bits", type=int, default=15, help="number of bits n (state, goal and actions); episodes last n steps"
    )
    p.add_argument("--cycles", type=int, default=200, help="training cycles (env steps, then gradient steps)")
    p.add_argument("--envs", type=int, default=16, help="bit-flipping envs stepped together (the buffer's num_envs)")
    p.add_argument("--steps-per-cycle", type=int, default=16, help="env steps of all envs per cycle")
    p.add_argument("--updates", type=int, default=40, help="gradient steps per cycle")
    p.add_argument("--batch-size", type=int, default=128, help="transitions per gradient step")
    p.add_argument("--buffer-size", type=int, default=100_000, help="replay capacity in rows (rounded to --envs)")
    p.add_argument("--n-sampled-goal", type=int, default=4, help="relabeled rows per real one (her_ratio = k/(k+1))")
    p.add_argument("--strategy", default="future", choices=["future", "final", "episode"], help="goal selection")
    p.add_argument("--no-her", action="store_true", help="plain DQN: the same buffer with n_sampled_goal=0")
    p.add_argument("--hidden", type=int, default=256, help="width of the Q-network's hidden layer")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=0.98, help="discount factor")
    p.add_argument(
        "--polyak", type=float, default=0.95, help="target network <- polyak * target + (1 - polyak) * online"
    )
    p.add_argument("--epsilon", type=float, default=0.2, help="epsilon-greedy exploration while training")
    p.add_argument("--eval-episodes", type=int, default=256, help="greedy episodes of the final success rate")
    p.add_argument("--eval-every", type=int, default=25, help="cycles between success-rate prints (0: only the final)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0, help="seeds torch, the envs and the buffer")
    args = p.parse_args(argv)
    if args.no_her:
        args.n_sampled_goal = 0
    return args


class BitFlipping:
    """``envs`` bit-flipping episodes as tensors ``[envs, bits]`` (float 0/1); ends reset at once."""

    def __init__(self, envs: int, bits: int, generator: torch.Generator) -> None:
        import torch

        self.bits, self.generator = bits, generator
        self.state = torch.zeros(envs, bits)
        self.goal = torch.zeros(envs, bits)
        self.steps = torch.zeros(envs, dtype=torch.long)
        self.reset(torch.ones(envs, dtype=torch.bool))

    def reset(self, which: torch.Tensor) -> None:
        import torch

        n = int(which.sum())
        self.state[which] = torch.randint(0, 2, (n, self.bits), generator=self.generator).float()
        self.goal[which] = torch.randint(0, 2, (n, self.bits), generator=self.generator).float()
        self.steps[which] = 0

    def step(self, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flip bit ``action[e]`` of env ``e``; return the transition rows (before resetting ended envs)."""
        import torch

        rows = torch.arange(self.state.shape[0])
        observation = self.state.clone()
        self.state[rows, action] = 1.0 - self.state[rows, action]
        self.steps += 1
        success = (self.state == self.goal).all(1)
        truncated = ~success & (self.steps >= self.bits)
        transition = {
            "observation": observation,
            "achieved_goal": observation,
            "desired_goal": self.goal.clone(),
            "action": action,
            "reward": success.float() - 1.0,
            "next_observation": self.state.clone(),
            "next_achieved_goal": self.state.clone(),
            "next_desired_goal": self.goal.clone(),
            "terminated": success,
            "truncated": truncated,
        }
        self.reset(success | truncated)
        return transition


def compute_reward(achieved: torch.Tensor, desired: torch.Tensor, infos: object) -> torch.Tensor:
    """The env's reward, vectorised: 0 where the achieved goal is the desired one, else -1."""
    return (achieved == desired).all(-1).float() - 1.0


def greedy(q_network: torch.nn.Module, observation: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    import torch

    with torch.no_grad():
        return q_network(torch.cat([observation, goal], -1)).argmax(-1)


def success_rate(q_network: torch.nn.Module, bits: int, episodes: int, generator: torch.Generator) -> float:
    """Share of ``episodes`` fresh episodes the greedy policy solves within ``bits`` steps."""
    import torch

    env = BitFlipping(episodes, bits, generator)
    solved = torch.zeros(episodes, dtype=torch.bool)
    state, goal = env.state.clone(), env.goal.clone()
    for _ in range(bits):
        action = greedy(q_network, state, goal)
        state[torch.arange(episodes), action] = 1.0 - state[torch.arange(episodes), action]
        solved |= (state == goal).all(1)  # an episode ends when solved: later steps do not undo it
    return float(solved.float().mean())


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    import torch
    from torch import nn

    from objectrl_buffer import HerReplayBuffer

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    n = args.bits
    buffer_size = max(args.envs, args.buffer_size // args.envs * args.envs)
    memory = HerReplayBuffer(
        "cpu", "cpu", buffer_size, compute_reward=compute_reward, n_sampled_goal=args.n_sampled_goal,
        goal_selection_strategy=args.strategy, num_envs=args.envs, seed=args.seed,
    )  # fmt: skip

    def network() -> nn.Module:
        return nn.Sequential(nn.Linear(2 * n, args.hidden), nn.ReLU(), nn.Linear(args.hidden, n))

    q_network, target = network(), network()
    target.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.lr)
    env = BitFlipping(args.envs, n, generator)
    low = -1.0 / (1.0 - args.gamma)  # the lowest return possible: targets are clipped to [low, 0]
    started = time.perf_counter()
    her = "off" if args.n_sampled_goal == 0 else f"{args.strategy}, n_sampled_goal={args.n_sampled_goal}"
    print(f"bits={n} her={her}")
    for cycle in range(1, args.cycles + 1):
        for _ in range(args.steps_per_cycle):
            action = greedy(q_network, env.state, env.goal)
            explore = torch.rand(args.envs, generator=generator) < args.epsilon
            action = torch.where(explore, torch.randint(0, n, (args.envs,), generator=generator), action)
            memory.add(env.step(action))
        if memory.sampleable_rows == 0:
            continue  # no episode has ended yet
        for _ in range(args.updates):
            batch = memory.sample(args.batch_size)
            with torch.no_grad():
                next_input = torch.cat([batch["next_observation"], batch["next_desired_goal"]], -1)
                best = q_network(next_input).argmax(-1, keepdim=True)  # Double DQN
                bootstrap = target(next_input).gather(1, best).squeeze(1)
                alive = 1.0 - batch["terminated"].float()
                y = (batch["reward"] + args.gamma * alive * bootstrap).clamp(low, 0.0)
            q = q_network(torch.cat([batch["observation"], batch["desired_goal"]], -1))
            loss = nn.functional.mse_loss(q.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for p_target, p in zip(target.parameters(), q_network.parameters(), strict=True):
                    p_target.mul_(args.polyak).add_(p, alpha=1.0 - args.polyak)
        if args.eval_every and cycle % args.eval_every == 0:
            rate = success_rate(q_network, n, args.eval_episodes, generator)
            print(f"cycle {cycle}: success {rate:.2f} ({time.perf_counter() - started:.0f} s)", flush=True)
    rate = success_rate(q_network, n, args.eval_episodes, generator)
    print(f"{args.cycles} cycles, {len(memory)} rows, {time.perf_counter() - started:.1f} s")
    print(f"final success rate: {rate:.2f}")
    return rate


if __name__ == "__main__":
    main()
