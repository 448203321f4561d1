"""DQN on gymnasium CartPole-v1, storing and sampling through objectrl_buffer.ReplayBuffer.

One readable file in the CleanRL style. The buffer is used exactly as ObjectRL's agents use theirs:

* built once, positionally: ``ReplayBuffer(torch.device(device), torch.device(storing_device), buffer_size)``;
* every env step: a ``TensorDict`` transition (state/action/next_state tensors, reward/terminated/truncated
  as Python floats, an int step) goes in with ``memory.add(td)`` (``--plain-dict`` passes a dict instead);
* every ``--learn-frequency`` env steps (after ``--learning-starts``): ``len(memory)`` guard, then
  ``n_steps = memory.get_steps_and_iterator(n_epochs, max_iter, batch_size)`` and one
  ``memory.get_next_batch(batch_size)`` per gradient step.

The learner is a Double DQN with a Huber loss, gradient clipping, Adam and a target network synced every
``--target-network-frequency`` gradient steps (with the defaults: once per learn call). The
learning rate decays linearly to 0 over the run (as CleanRL's PPO does): without it the policy keeps
collapsing and recovering, so the return at a fixed step count swings widely (seeds 1-4 ended at 276-382).
With the defaults (seed 1, 50,000 env steps, one to two minutes on one free CPU core) the mean return of the
last 20 training episodes (epsilon 0.02 still on) ends well above the "solved" level of 195: seeds 1-5 ended
at 486.5, 476.1, 500.0, 478.9 and 449.4 (each the same on every run: see "Reproducible").

    python examples/dqn_cartpole.py                    # the documented default run
    python examples/dqn_cartpole.py --save runs/dqn    # + the buffer checkpoint runs/dqn.metadata and runs/dqn.data-*/
                                                       #   (every row) and the learner runs/dqn.agent.pt
    python examples/dqn_cartpole.py --resume runs/dqn --total-steps 10000           # continue that run
    python examples/dqn_cartpole.py --resume-metadata runs/dqn --total-steps 10000  # ObjectRL's resume: empty buffer

``--resume`` continues a run where ``--save`` left it: the buffer comes back with every row
(``ReplayBuffer.from_checkpoint``; its capacity, ring position and sampling generator are the saved ones), and
the Q-network, target network, optimizer, global step and episode history from ``PATH.agent.pt``. Learning goes
on at once: the global step is past ``--learning-starts`` and the buffer already holds the old rows.
``--resume-metadata`` is what ObjectRL itself can do: its ``save`` keeps three counters and no rows, so the
buffer restarts empty (``--no-save-data`` writes only those counters).

Output: a tqdm bar (interactive terminals only), the mean return of the last 20 episodes, the wall time and
the share spent inside buffer calls, and a learning-curve PNG (``--plot``, default ``runs/dqn_cartpole.png``).
The process exits 0 whether or not the 195 criterion is met; the last lines say which.

Reproducible: on CPU a seed gives the same bits on every run (episode returns, final weights, the PNG), on any
x86-64 CPU with AVX2 or AVX-512 and the pinned versions (.ci/constraints-cpu.txt). What it takes: one
intra-op thread (``--threads``; ``OMP_NUM_THREADS`` does not matter), ``MKL_CBWR=COMPATIBLE`` (set below
unless the environment sets it), ``torch.use_deterministic_algorithms`` on CPU, the env reset with the seed
once, exploration drawn from ``np.random.default_rng(seed)``, and the buffer's sampling generator given
``seed=`` explicitly. Another BLAS (ARM: no MKL) or other torch/NumPy/gymnasium versions round differently:
the JSON records these under ``"numerics"``. Only the wall time and the buffer's share of it vary from run to
run. ``make train`` writes the README's figure and numbers and the short reference the tests compare a re-run with:

    python examples/dqn_cartpole.py --short-reference   # docs/dqn_cartpole_short.json (seconds)
    python examples/dqn_cartpole.py --plot docs/dqn_cartpole.png --summary docs/dqn_cartpole.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import random
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOLVED_RETURN = 195.0  # CartPole's classic "solved" threshold (mean over the last episodes)
#: ``--short-reference`` without a path writes here; tests/test_main_job.py re-runs it and compares.
SHORT_REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "dqn_cartpole_short.json"
#: The short run of ``--short-reference`` (under 2 s of CPU): the ring of 1,000 rows wraps twice, and 25 learn
#: calls of 32 gradient steps train a smaller network that acts greedily from step 600 on (returns climb from
#: ~10 to ~100), so any change in what the buffer stores or samples, or in the learner, moves its episode
#: returns and final weights.
SHORT_RUN = (
    "--total-steps", "3000", "--buffer-size", "1000", "--learning-starts", "500", "--learn-frequency", "100",
    "--max-iter", "32", "--hidden", "64", "--learning-rate", "3e-3", "--no-progress", "--plot", "",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1, help="seeds python, numpy, torch, the env and the buffer")
    p.add_argument("--total-steps", type=int, default=50_000, help="env steps to run in this invocation")
    p.add_argument("--buffer-size", type=int, default=100_000, help="replay capacity in transitions")
    p.add_argument("--batch-size", type=int, default=64, help="transitions per gradient step")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers of the Q-network")
    p.add_argument("--learning-starts", type=int, default=1_000, help="global env step before the first learn call")
    p.add_argument("--learn-frequency", type=int, default=256, help="env steps between learn calls")
    p.add_argument("--max-iter", type=int, default=128, help="gradient steps per learn call when --n-epochs is 0")
    p.add_argument(
        "--n-epochs", type=int, default=0, help="> 0: each learn call makes this many epoch passes over the buffer"
    )
    p.add_argument(
        "--target-network-frequency", type=int, default=128, help="gradient steps between target-network syncs"
    )
    p.add_argument("--double", action=argparse.BooleanOptionalAction, default=True, help="Double DQN targets")
    p.add_argument("--loss", choices=["huber", "mse"], default="huber", help="TD loss")
    p.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decay the learning rate linearly to 0 over --total-steps",
    )
    p.add_argument("--max-grad-norm", type=float, default=10.0, help="gradient-norm clip (0 disables)")
    p.add_argument("--start-e", type=float, default=1.0, help="initial epsilon of the epsilon-greedy policy")
    p.add_argument("--end-e", type=float, default=0.02, help="final epsilon")
    p.add_argument(
        "--exploration-fraction", type=float, default=0.2, help="fraction of --total-steps over which epsilon decays"
    )
    p.add_argument("--device", default="cpu", help="training device (where samples are delivered)")
    p.add_argument("--storing-device", default="cpu", help="where the buffer stores transitions")
    p.add_argument("--storage-dir", default=None, help="folder for the CPU memmap files (None: the system temp folder)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (small nets run best on 1-2)")
    p.add_argument("--plain-dict", action="store_true", help="add() plain dicts instead of TensorDicts")
    p.add_argument("--window", type=int, default=20, help="episodes in the reported mean return")
    p.add_argument("--plot", default="runs/dqn_cartpole.png", help="learning-curve PNG path ('' to skip)")
    p.add_argument(
        "--summary",
        default="",
        metavar="PATH",
        help="also write the run's record as JSON to PATH: seed, steps, mean return, every episode's return and "
        "end step, a digest of the final weights, the numerics (versions, BLAS), and the measured wall time and "
        "buffer share",
    )
    p.add_argument(
        "--save",
        default=None,
        metavar="PATH",
        help="at the end: the buffer checkpoint PATH.metadata (+ its rows in PATH.data-*/, see --save-data) "
        "and the learner PATH.agent.pt",
    )
    p.add_argument(
        "--save-data",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--save writes every row of the buffer too (a full checkpoint, what --resume needs); "
        "--no-save-data writes only ObjectRL's metadata (three counters)",
    )
    resume = p.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue a run saved with --save: the buffer with its rows (capacity from the checkpoint, not "
        "--buffer-size), the Q-network, target network, optimizer, global step and episodes from PATH.agent.pt",
    )
    resume.add_argument(
        "--resume-metadata",
        default=None,
        metavar="PATH",
        help="ObjectRL's resume: load PATH.metadata (and PATH.agent.pt if present), continue the global step "
        "count, and refill the buffer from empty (the metadata holds no rows)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (also off when not a TTY)")
    p.add_argument(
        "--short-reference",
        nargs="?",
        const=str(SHORT_REFERENCE),
        default=None,
        metavar="PATH",
        help="run the fixed short configuration SHORT_RUN (seconds; other options are ignored) and write "
        "its record to PATH (default: docs/dqn_cartpole_short.json), which tests/test_main_job.py compares with",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and argument errors answer here, before torch and gymnasium load (seconds)

# One code path for MKL, torch's matrix multiply on x86: by default it picks its kernels by CPU (Intel or
# AMD, AVX2 or AVX-512) and they round differently; the differences grow over training until a greedy action
# flips and the curve departs. COMPATIBLE is MKL's "conditional numerical reproducibility" branch: the same
# results on any x86-64 CPU for a fixed thread count. MKL reads it once, at its first call, so it is set here,
# before torch is imported (see "Reproducible" above).
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import Tensor, nn
from tqdm import tqdm

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.io import atomic_write


class QNetwork(nn.Module):
    """obs [B, obs_dim] -> Q-values [B, n_actions]."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class Stopwatch:
    """Accumulates the seconds spent inside ``with`` blocks (here: the buffer calls)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start


@dataclass
class RunState:
    """What a run carries over into a resumed one."""

    global_step: int = 0
    gradient_steps: int = 0  # over the whole run: the target network syncs every --target-network-frequency
    agent_state: dict[str, Any] | None = None  # the PATH.agent.pt dict (see save_run), when there is one
    episode_returns: list[float] = field(default_factory=list)
    episode_ends: list[int] = field(default_factory=list)  # global step at which each episode ended


def curve(run: RunState) -> dict[str, list[Any]]:
    """Every episode's return and the global step it ended at (the learning curve, for the JSON records)."""
    return {"episode_returns": run.episode_returns, "episode_ends": run.episode_ends}


def write_json(path: str, record: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1) + "\n")


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    slope = (end - start) / max(duration, 1)
    return max(slope * t + start, end)


# ----------------------------------------------------------------------------------------- buffer + checkpoints
def agent_path(path: str) -> str:
    return f"{path}.agent.pt"


def load_agent_state(path: str) -> dict[str, Any] | None:
    """The ``PATH.agent.pt`` dict written by :func:`save_run`, or ``None`` when there is none."""
    if not os.path.exists(agent_path(path)):
        return None
    return torch.load(agent_path(path), weights_only=True)


def continued(global_step: int, agent: dict[str, Any] | None) -> RunState:
    """What a resumed run carries on with: the agent file's state, or only ``global_step`` without one."""
    if agent is None:
        return RunState(global_step=global_step)
    return RunState(
        int(agent["global_step"]),
        int(agent.get("gradient_steps", 0)),
        agent,
        list(agent["episode_returns"]),
        list(agent["episode_ends"]),
    )


def resume_run(args: argparse.Namespace) -> tuple[ReplayBuffer, RunState]:
    """``--resume PATH``: the buffer of a full checkpoint, rows included, and the learner of ``PATH.agent.pt``.

    ``ReplayBuffer.from_checkpoint`` builds the buffer with the saved capacity, rows, ring position and sampling
    generator, on this run's devices. Without the agent file the Q-network starts afresh and the global step
    continues after the newest stored transition's ``step``.
    """
    path = args.resume
    memory = ReplayBuffer.from_checkpoint(
        path, torch.device(args.device), torch.device(args.storing_device), storage_dir=args.storage_dir
    )
    if len(memory) and memory.schema is None:
        memory.close()
        raise SystemExit(
            f"--resume {path}: {path}.metadata holds counters but no rows (saved with --no-save-data); "
            f"use --resume-metadata {path} to continue with an empty buffer"
        )
    agent = load_agent_state(path)
    if agent is not None:
        global_step = int(agent["global_step"])
    elif len(memory):
        newest = (memory.pointer - 1) % memory.buffer_size
        global_step = int(memory.sample_by_index_fields([newest], "step")["step"][0]) + 1
    else:
        global_step = 0
    print(
        f"resumed from {path}: {len(memory)} rows (capacity {memory.buffer_size}, pointer {memory.pointer}), "
        f"global step {global_step}" + ("" if agent is None else f"; learner from {agent_path(path)}")
    )
    return memory, continued(global_step, agent)


def restore_run(args: argparse.Namespace) -> tuple[ReplayBuffer, RunState]:
    """The replay buffer, built as ObjectRL's base agent builds it, and what this run continues from.

    ``--resume PATH``: see :func:`resume_run`. ``--resume-metadata PATH``: ``memory.load`` restores the buffer
    counters (ObjectRL's metadata holds no rows) and the global step count continues from ``PATH.agent.pt``
    (or, without it, from the counters). The buffer is emptied afterwards, also when the checkpoint holds rows:
    this is the resume ObjectRL's metadata-only ``save`` allows, where sampling slots never written here would
    train on zeros.
    """
    if args.resume:
        return resume_run(args)
    memory = ReplayBuffer(
        torch.device(args.device), torch.device(args.storing_device), args.buffer_size,
        seed=args.seed, storage_dir=args.storage_dir,
    )  # fmt: skip
    if not args.resume_metadata:
        return memory, RunState()
    path = args.resume_metadata
    memory.load(path)
    agent = load_agent_state(path)
    # Without the agent file: exact while the ring had not wrapped, a lower bound after.
    global_step = memory.data_size if agent is None else int(agent["global_step"])
    print(
        f"resumed from {path}.metadata: data_size={memory.data_size}, pointer={memory.pointer}, "
        f"global step {global_step}" + ("" if agent is None else f"; Q-network from {agent_path(path)}")
    )
    memory.reset()
    return memory, continued(global_step, agent)


def save_run(path: str, memory: ReplayBuffer, q_network: nn.Module, target_network: nn.Module,
             optimizer: torch.optim.Optimizer, run: RunState, data: bool) -> None:  # fmt: skip
    """The buffer with ``memory.save`` (``PATH.metadata``, with ``data`` also every row in ``PATH.data-*/``) and
    the learner beside it (``PATH.agent.pt``). Each file is replaced atomically: a crash leaves it old or new, whole."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    memory.save(path, data=data)
    agent = {
        "q_network": q_network.state_dict(),
        "target_network": target_network.state_dict(),
        "optimizer": optimizer.state_dict(),
        "global_step": run.global_step,
        "gradient_steps": run.gradient_steps,
        "episode_returns": run.episode_returns,
        "episode_ends": run.episode_ends,
    }
    atomic_write(agent_path(path), lambda f: torch.save(agent, f))


def dqn_loss(batch: TensorDict, q_network: nn.Module, target_network: nn.Module, args: argparse.Namespace) -> Tensor:
    """TD loss of one sampled batch (keys as ObjectRL's DQN reads them; ``[B]`` rows)."""
    with torch.no_grad():
        next_q = target_network(batch["next_state"])  # [B, n_actions]
        if args.double:  # the online network picks the action, the target network values it
            best = q_network(batch["next_state"]).argmax(dim=1, keepdim=True)
            next_value = next_q.gather(1, best).squeeze(1)
        else:
            next_value = next_q.max(dim=1).values
        # Bootstrap through truncation (time limit), not through termination (the pole fell).
        td_target = batch["reward"] + args.gamma * (1.0 - batch["terminated"]) * next_value
    q_value = q_network(batch["state"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    loss_fn = F.smooth_l1_loss if args.loss == "huber" else F.mse_loss
    return loss_fn(q_value, td_target)


# ----------------------------------------------------------------------------------------- reporting
def plot_learning_curve(run: RunState, window: int, path: str, title: str) -> None:
    """Episode returns against the env step at which each episode ended, with their moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, returns = np.asarray(run.episode_ends), np.asarray(run.episode_returns)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, returns, color="tab:blue", alpha=0.35, linewidth=1, label="episode return")
    if len(returns) >= window:
        moving = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], moving, color="tab:blue", linewidth=2, label=f"mean of last {window} episodes")
    ax.axhline(SOLVED_RETURN, color="tab:red", linestyle="--", linewidth=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set(xlabel="env step", ylabel="return", title=title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------- reproducibility
@contextmanager
def reproducible(threads: int, device: torch.device) -> Iterator[None]:
    """torch's settings for a run whose numbers are the same bits every time for a seed (CPU).

    A fixed intra-op thread count (MKL's reproducible branch needs one; ``OMP_NUM_THREADS`` is overridden) and,
    on CPU, ``torch.use_deterministic_algorithms`` (an operation without a deterministic CPU kernel raises
    instead of varying). Both are restored afterwards: the tests run :func:`main` in their own process.
    """
    threads_before = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    if device.type == "cpu":  # CUDA would also need CUBLAS_WORKSPACE_CONFIG; no claim is made there
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads_before)
        torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)


def weights_digest(network: nn.Module) -> str:
    """SHA-256 of a network's parameters and buffers (names, dtypes, shapes and bytes), in state-dict order."""
    digest = hashlib.sha256()
    for name, tensor in network.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def numerics_probe() -> str:
    """The first 16 hex digits of SHA-256 of a fixed float32 matrix product and its reductions, the operations
    the Q-network's training is made of. Two processes with different probes round differently (another MKL
    branch, thread count or BLAS); equal probes are no proof of the converse (torch's unvectorized kernels,
    on x86 without AVX2, give this probe but other weights)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(64, 257, generator=generator) - 0.5  # uniform draws are exact arithmetic on every CPU
    b = torch.rand(257, 255, generator=generator) - 0.5
    c = torch.relu(a @ b)
    digest = hashlib.sha256()
    for value in (c, c.sum(0), c.norm(), F.smooth_l1_loss(c, c.flip(0))):
        digest.update(value.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def numerics() -> dict[str, Any]:
    """What a run's bits depend on besides the code and the seed (written into the JSON records)."""
    return {
        "machine": platform.machine(),
        "blas": "mkl" if torch.backends.mkl.is_available() else "other",
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "probe": numerics_probe(),
    }


# ----------------------------------------------------------------------------------------- training
def main(argv: list[str] | None = None) -> float:
    """Train, report, and return the mean return of the last ``--window`` episodes (nan if none finished)."""
    args = parse_args(argv)
    if args.short_reference:
        args = parse_args([*SHORT_RUN, "--short-reference", args.short_reference])
    with reproducible(args.threads, torch.device(args.device)):
        return train(args)


def train(args: argparse.Namespace) -> float:
    """The run of :func:`main`, with torch's settings already made."""
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # its INFO line on the first write is noise here
    wall_start = time.perf_counter()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # exploration randomness
    device = torch.device(args.device)

    env = gym.make("CartPole-v1")
    env.action_space.seed(args.seed)
    assert isinstance(env.observation_space, gym.spaces.Box) and isinstance(env.action_space, gym.spaces.Discrete)
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    q_network = QNetwork(obs_dim, n_actions, args.hidden).to(device)
    target_network = QNetwork(obs_dim, n_actions, args.hidden).to(device)

    memory, run = restore_run(args)
    if run.agent_state is not None:
        q_network.load_state_dict(run.agent_state["q_network"])
    saved_target = None if run.agent_state is None else run.agent_state.get("target_network")
    target_network.load_state_dict(q_network.state_dict() if saved_target is None else saved_target)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    if run.agent_state is not None:
        optimizer.load_state_dict(run.agent_state["optimizer"])
    storing_device = memory.storing_device

    add_clock, sample_clock = Stopwatch(), Stopwatch()
    first_step = run.global_step
    last_step = first_step + args.total_steps
    recent = deque(run.episode_returns[-args.window :], maxlen=args.window)
    gradient_steps, episode_return = 0, 0.0
    obs, _ = env.reset(seed=args.seed + first_step)
    progress = tqdm(total=args.total_steps, desc="DQN CartPole-v1", disable=args.no_progress or not sys.stderr.isatty())
    for global_step in range(first_step, last_step):
        epsilon = linear_schedule(
            args.start_e, args.end_e, int(args.exploration_fraction * args.total_steps), global_step
        )
        state = torch.from_numpy(obs)
        if rng.random() < epsilon:
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(q_network(state.to(device)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        episode_return += float(reward)

        # The transition exactly as ObjectRL's agent.generate_transition builds it, then memory.add.
        transition = {
            "state": state.to(storing_device),
            "action": torch.tensor(action, device=storing_device),
            "next_state": torch.from_numpy(next_obs).to(storing_device),
            "reward": float(reward),
            "terminated": float(terminated),
            "truncated": float(truncated),
            "step": global_step,
        }
        item = transition if args.plain_dict else TensorDict(transition, batch_size=[])  # the agent's cost
        with add_clock:
            memory.add(item)

        obs = next_obs
        if terminated or truncated:
            run.episode_returns.append(episode_return)
            run.episode_ends.append(global_step + 1)
            recent.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
            progress.set_postfix(episodes=len(run.episode_returns), mean=f"{np.mean(recent):.1f}", eps=f"{epsilon:.2f}")

        # One learn call, as ObjectRL's DQN.learn does it.
        if global_step >= args.learning_starts and (global_step + 1) % args.learn_frequency == 0:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - (global_step - first_step) / args.total_steps
                )
            with sample_clock:
                ready = len(memory) >= args.batch_size
                n_steps = memory.get_steps_and_iterator(args.n_epochs, args.max_iter, args.batch_size) if ready else 0
            for _ in range(n_steps):
                with sample_clock:
                    batch = memory.get_next_batch(args.batch_size)
                loss = dqn_loss(batch, q_network, target_network, args)
                optimizer.zero_grad()
                loss.backward()
                if args.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()
                gradient_steps += 1
                if (run.gradient_steps + gradient_steps) % args.target_network_frequency == 0:
                    target_network.load_state_dict(q_network.state_dict())
        progress.update(1)
    progress.close()
    env.close()
    run.global_step = last_step
    run.gradient_steps += gradient_steps

    if args.save:
        save_run(args.save, memory, q_network, target_network, optimizer, run, args.save_data)
        what = f"the buffer ({len(memory)} rows)" if args.save_data else "the buffer metadata"
        print(f"saved {what} to {args.save}.metadata and the learner to {agent_path(args.save)}")
    wall = time.perf_counter() - wall_start
    buffer_s = add_clock.seconds + sample_clock.seconds

    mean_return = float(np.mean(recent)) if recent else float("nan")
    if args.plot:
        title = f"DQN CartPole-v1 (objectrl_buffer), seed {args.seed}, {args.total_steps} env steps"
        plot_learning_curve(run, args.window, args.plot, title)
        print(f"learning curve: {args.plot}")
    print(
        f"episodes: {len(run.episode_returns)}, global steps {first_step} -> {last_step}, "
        f"gradient steps: {gradient_steps}"
    )
    print(f"wall time: {wall:.1f} s")
    print(
        f"buffer time: {buffer_s:.2f} s of {wall:.1f} s ({100 * buffer_s / wall:.1f}%) "
        f"[add {add_clock.seconds:.2f} s, sampling {sample_clock.seconds:.2f} s]"
    )
    verdict = "met" if mean_return >= SOLVED_RETURN else "NOT met"
    # The record of what the run computed: the same bits for a seed on any x86-64 CPU (see "Reproducible").
    record: dict[str, Any] = {
        "seed": args.seed,
        "total_steps": args.total_steps,
        "episodes": len(run.episode_returns),
        "window": len(recent),
        "mean_return": round(mean_return, 1),
        "gradient_steps": gradient_steps,
        "q_network_sha256": weights_digest(q_network),
    }
    if args.short_reference:
        short = {"command": "python examples/dqn_cartpole.py --short-reference", "args": list(SHORT_RUN)}
        write_json(args.short_reference, {**short, **record, "numerics": numerics(), **curve(run)})
        print(f"short reference: {args.short_reference}")
    if args.summary:  # what docs/dqn_cartpole.json holds, so the README can quote the run it shows
        measured = {"wall_s": round(wall, 1), "buffer_share_percent": round(100 * buffer_s / wall, 1)}  # vary
        write_json(args.summary, {**record, **measured, "plot": args.plot, "numerics": numerics(), **curve(run)})
        print(f"summary: {args.summary}")
    print(f"criterion mean return >= {SOLVED_RETURN:g}: {verdict}")
    print(f"mean return over last {len(recent)} episodes: {mean_return:.1f}")
    return mean_return


if __name__ == "__main__":
    main()
