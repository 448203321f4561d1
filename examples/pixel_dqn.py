"""DQN from pixels: gymnasium CartPole-v1 rendered to frames, stored in a compact objectrl_buffer.ReplayBuffer.

One readable file in the style of ``dqn_cartpole.py``. The agent sees only pixels: each env step renders
CartPole (``render_mode="rgb_array"``, 400x600 RGB, drawn with pygame), turns the frame into 84x84 grayscale
(``uint8``), and stacks the last 4 frames (``[4, 84, 84]``, newest last; an episode starts with its first frame
repeated 4 times). Every transition is written as Atari DQN agents write theirs::

    {"state": uint8[4,84,84], "next_state": uint8[4,84,84], "action": int, "reward": float,
     "terminated": float, "truncated": float}

into a buffer built with the compact storage of issue 25::

    ReplayBuffer(device, storing_device, buffer_size,
                 next_of={"next_state": "state"}, frame_stack={"state": 4})

so a row stores about one new 84x84 frame (7,056 bytes) instead of the two full stacks a plain buffer keeps
(56,448 bytes). The run ends by printing the bytes per row the buffer takes (``memory.nbytes / len(memory)``)
and what a plain buffer would take for the same rows; ``--storage plain`` runs with today's storage instead.
``nbytes`` counts what the buffer holds for its capacity (the frame ring is laid out for ``--buffer-size``
rows), so the bytes per row are those of a full buffer once the run has filled it.

The learner is a Double DQN with the Nature-DQN convolutional network (scaled down: two conv layers), a Huber
loss, Adam and a target network. CartPole from pixels is much harder than from its state vector: with the
defaults the agent improves on the random policy (~22 steps an episode) but does not solve the task.

    python examples/pixel_dqn.py                                    # the default run (minutes on 2 cores)
    python examples/pixel_dqn.py --total-steps 300 --buffer-size 500 --learning-starts 100   # a smoke run
    python examples/pixel_dqn.py --storage plain                    # the same run with today's storage
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch and gymnasium are imported once the arguments are parsed (--help stays fast)
    from torch import Tensor, nn

FRAME = 84  # frames are FRAME x FRAME grayscale
STACK = 4  # frames per observation
RANDOM_RETURN = 22.0  # CartPole-v1's mean episode length under a uniformly random policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1, help="seeds python, numpy, torch, the env and the buffer")
    p.add_argument("--total-steps", type=int, default=30_000, help="env steps to run")
    p.add_argument("--buffer-size", type=int, default=30_000, help="replay capacity in transitions")
    p.add_argument(
        "--storage",
        choices=["compact", "plain"],
        default="compact",
        help="compact: next_of + frame_stack (about one frame a row); plain: both stacks stored in full",
    )
    p.add_argument("--batch-size", type=int, default=32, help="transitions per gradient step")
    p.add_argument("--learning-rate", type=float, default=2.5e-4, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--learning-starts", type=int, default=1_000, help="env steps before the first gradient step")
    p.add_argument("--train-frequency", type=int, default=4, help="env steps between gradient steps")
    p.add_argument("--target-network-frequency", type=int, default=500, help="env steps between target syncs")
    p.add_argument("--start-e", type=float, default=1.0, help="initial epsilon of the epsilon-greedy policy")
    p.add_argument("--end-e", type=float, default=0.05, help="final epsilon")
    p.add_argument(
        "--exploration-fraction", type=float, default=0.3, help="fraction of --total-steps over which epsilon decays"
    )
    p.add_argument("--device", default="cpu", help="training device (where samples are delivered)")
    p.add_argument("--storing-device", default="cpu", help="where the buffer stores transitions")
    p.add_argument("--storage-dir", default=None, help="folder for the CPU memmap files (None: the default placement)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--window", type=int, default=20, help="episodes in the reported mean return")
    p.add_argument("--summary", default="", metavar="PATH", help="also write the run's numbers as JSON to PATH")
    return p.parse_args(argv)


def to_frame(rgb: np.ndarray) -> np.ndarray:
    """A rendered RGB frame ``uint8[H, W, 3]`` -> ``uint8[84, 84]`` grayscale (area-filtered resize)."""
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).convert("L").resize((FRAME, FRAME), Image.Resampling.BILINEAR))


def q_network(n_actions: int) -> nn.Module:
    """``uint8[B, 4, 84, 84]`` -> Q-values ``[B, n_actions]`` (frames scaled to [0, 1] inside)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(STACK, 16, 8, stride=4), nn.ReLU(),  # -> [B, 16, 20, 20]
        nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),  # -> [B, 32, 9, 9]
        nn.Flatten(), nn.Linear(32 * 9 * 9, 256), nn.ReLU(), nn.Linear(256, n_actions),
    )  # fmt: skip


def forward(net: nn.Module, frames: Tensor) -> Tensor:
    return net(frames.float() / 255.0)


def best_window(returns: list[float], window: int) -> float:
    """The best mean return of ``window`` consecutive episodes (nan with fewer episodes)."""
    if len(returns) < window:
        return float("nan")
    return float(np.convolve(returns, np.ones(window) / window, "valid").max())


def plain_row_bytes(memory: Any) -> int:
    """Bytes one row takes in a plain buffer: every key of the schema stored in full."""
    return sum(f.row_bytes for f in memory.schema.fields)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train, report, and return the run's numbers (mean return, bytes per row, ...)."""
    args = parse_args(argv)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen: no display, no warning
    os.environ.setdefault("SDL_NO_SIGNAL_HANDLERS", "1")  # else SDL swallows SIGINT/SIGTERM: Ctrl-C must stop a run
    import random

    import gymnasium as gym
    import torch
    import torch.nn.functional as F

    from objectrl_buffer import ReplayBuffer

    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)

    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.action_space.seed(args.seed)
    n_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    online, target = q_network(n_actions).to(device), q_network(n_actions).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=args.learning_rate)

    compact = args.storage == "compact"
    memory = ReplayBuffer(
        device, torch.device(args.storing_device), args.buffer_size, seed=args.seed, storage_dir=args.storage_dir,
        next_of={"next_state": "state"} if compact else None,  # next_state is the next row's state ...
        frame_stack={"state": STACK} if compact else None,  # ... and state stacks the last 4 frames, newest last
    )  # fmt: skip

    def render() -> np.ndarray:
        rgb = env.render()
        assert isinstance(rgb, np.ndarray)  # render_mode="rgb_array": uint8[400, 600, 3]
        return to_frame(rgb)

    def reset(seed: int | None = None) -> deque[np.ndarray]:
        env.reset(seed=seed)
        first = render()
        return deque([first] * STACK, maxlen=STACK)

    frames = reset(args.seed)
    returns: list[float] = []
    recent: deque[float] = deque(maxlen=args.window)
    episode_return, gradient_steps = 0.0, 0
    explore_steps = max(int(args.exploration_fraction * args.total_steps), 1)
    for step in range(args.total_steps):
        epsilon = max(args.start_e + (args.end_e - args.start_e) * step / explore_steps, args.end_e)
        state = np.stack(frames)  # [4, 84, 84], newest last
        if rng.random() < epsilon:
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(forward(online, torch.from_numpy(state).to(device)[None]).argmax())
        _, reward, terminated, truncated, _ = env.step(action)
        frames.append(render())
        episode_return += float(reward)
        memory.add({
            "state": torch.from_numpy(state),
            "next_state": torch.from_numpy(np.stack(frames)),
            "action": action,
            "reward": float(reward),
            "terminated": float(terminated),
            "truncated": float(truncated),  # with terminated: where episodes end (the compact storage needs both)
        })  # fmt: skip
        if terminated or truncated:
            returns.append(episode_return)
            recent.append(episode_return)
            episode_return = 0.0
            frames = reset()

        if step >= args.learning_starts and step % args.train_frequency == 0:
            batch = memory.sample_batch(args.batch_size)
            with torch.no_grad():  # Double DQN: the online network picks, the target network values
                best = forward(online, batch["next_state"]).argmax(dim=1, keepdim=True)
                next_value = forward(target, batch["next_state"]).gather(1, best).squeeze(1)
                td_target = batch["reward"] + args.gamma * (1.0 - batch["terminated"]) * next_value
            q = forward(online, batch["state"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
            loss = F.smooth_l1_loss(q, td_target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(online.parameters(), 10.0)
            optimizer.step()
            gradient_steps += 1
        if step % args.target_network_frequency == 0:
            target.load_state_dict(online.state_dict())
        if args.total_steps >= 10_000 and (step + 1) % (args.total_steps // 10) == 0:
            print(f"step {step + 1}: episodes {len(returns)}, mean return of the last {len(recent)}: "
                  f"{np.mean(recent) if recent else float('nan'):.1f}, epsilon {epsilon:.2f}", flush=True)  # fmt: skip
    env.close()

    per_row = memory.nbytes / len(memory)
    plain = plain_row_bytes(memory)
    mean_return = float(np.mean(recent)) if recent else float("nan")
    wall = time.perf_counter() - wall_start
    print(f"episodes: {len(returns)}, env steps: {args.total_steps}, gradient steps: {gradient_steps}")
    print(f"wall time: {wall:.1f} s")
    print(
        f"buffer ({args.storage}): {len(memory)} rows, {memory.nbytes / 2**20:.1f} MiB, "
        f"{per_row:,.0f} bytes per row ({per_row / (FRAME * FRAME):.2f} frames of {FRAME * FRAME:,} bytes; "
        f"a plain buffer: {plain:,} bytes per row, {plain / per_row:.1f}x more)"
    )
    result = {
        "seed": args.seed,
        "total_steps": args.total_steps,
        "storage": args.storage,
        "episodes": len(returns),
        "mean_return": round(mean_return, 1),
        "best_window_return": round(best_window(returns, args.window), 1),
        "bytes_per_row": round(per_row, 1),
        "plain_bytes_per_row": plain,
        "frame_bytes": FRAME * FRAME,
        "wall_s": round(wall, 1),
    }
    if args.summary:
        Path(args.summary).write_text(json.dumps(result, indent=1) + "\n")
        print(f"summary: {args.summary}")
    print(f"mean return over last {len(recent)} episodes: {mean_return:.1f} (random policy: ~{RANDOM_RETURN:g})")
    memory.close()
    return result


if __name__ == "__main__":
    main()
