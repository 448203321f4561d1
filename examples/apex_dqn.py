"""Ape-X-style DQN on gymnasium CartPole-v1: actors in Ray processes, one remote prioritized buffer, one learner.

One readable file in the CleanRL style (Horgan et al., 2018, "Distributed Prioritized Experience Replay",
scaled down to one machine):

* ``RemoteBuffer.launch(PrioritizedReplayBuffer, ..., num_shards=...)`` serves the replay memory from Ray actors.
* ``--num-actors`` actor processes (Ray actors), actor ``i`` of ``N`` acting epsilon-greedily with Ape-X's
  ``eps_i = 0.4 ** (1 + 7 i / (N - 1))`` (two actors: 0.4 and 0.4 ** 8), each with its own env and copy of
  the Q-network. They write ``--n-step`` transitions through ``handle.writer(batch_size=..., flush_every_s=...)``
  (batched client-side, a bounded number of batches in flight). New rows enter with the buffer's largest
  priority so far, so each is replayed soon (the write path returns no slots an actor could set a priority on).
* The learner (this process) samples with ``handle.prefetch(batch_size, depth=2)`` (samples in flight while it
  trains), makes a Double-DQN step weighted by the importance weights, sends ``|TD error|`` back with
  ``handle.update_priority(index, priority, generation)`` (an update to a slot rewritten since it was drawn is
  skipped), and broadcasts its weights every ``--broadcast-every`` updates: ``ray.put`` of the state dict as
  NumPy arrays (torch tensors through Ray's object store are pickled copies, 10-40x slower).
* A ``SampleToInsertRatio(--samples-per-insert, --min-size, --error-buffer)`` keeps the replay ratio: rows
  sampled per row inserted. By default the learner holds it (:class:`LearnerGate`): the rows the handle holds
  count as inserts, the learner's draws as samples, the learner draws only what it admits and the actors step
  only as far as it would admit inserts. With ``--server-limiter`` it is handed to ``RemoteBuffer.launch(...,
  rate_limiter=...)`` instead: the buffer's coordinator admits the actors' writes (a writer's batch waits
  until the ratio lets it in) and the learner's draws (counted when they are sent, so a prefetched draw
  counts before the learner trains on it); the learner's draws wait at most ``SAMPLE_TIMEOUT_S`` each, so
  the run ends once the actors are done and the ratio admits no more.

With the defaults (24,000 env steps over two actors, 32 sampled rows per row written, about 11,600 updates of
64) the greedy policy's mean return over the final 20 evaluation episodes is above CartPole's "solved" 195:
seeds 1-3 ended at 500.0, 230.4 and 500.0 (seed 2 sat at 150-190 until the last evaluation), 2.3-3.2 minutes
each on two CPU cores shared with other work, every evaluation >= 195 from 8,000-24,000 env steps on. Runs
are not bit-reproducible (actors and learner interleave by timing): three runs of seed 1 ended at 500.0, 500.0
and 298.6 (``docs/apex_dqn.json`` is the last of them, ``docs/apex_dqn.png`` its curve).

    python examples/apex_dqn.py                                   # the documented default run
    python examples/apex_dqn.py --num-actors 4 --num-shards 2     # more actors, the buffer in two shards
    python examples/apex_dqn.py --server-limiter                  # the buffer keeps the replay ratio
    python examples/apex_dqn.py --plot docs/apex_dqn.png --summary docs/apex_dqn.json

Output: a tqdm bar (interactive terminals only), the greedy evaluations as they come, the measured replay
ratio, the rows each actor wrote, the priority updates applied, and a learning-curve PNG (``--plot``, default
``runs/apex_dqn.png``; skipped without matplotlib). The process exits 0 whether or not the 195 criterion is met;
the last lines say which.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOLVED_RETURN = 195.0  # CartPole's classic "solved" threshold (mean over the last episodes)
# --server-limiter: how long one draw waits for the limiter before the learner looks whether the actors are done
SAMPLE_TIMEOUT_S = 0.5
PREFETCH_DEPTH = 2  # samples in flight while the learner trains
SYNC_PERIOD_S = 0.01  # how often the learner exchanges budget/weights/progress with each actor at most


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1, help="seeds python, numpy, torch, the envs and the buffer")
    p.add_argument("--total-steps", type=int, default=24_000, help="env steps over all actors")
    p.add_argument("--num-actors", type=int, default=2, help="actor processes (Ray actors)")
    p.add_argument("--num-shards", type=int, default=1, help="Ray actors serving the replay buffer")
    p.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...) when Ray is not running yet")
    p.add_argument("--buffer-size", type=int, default=100_000, help="replay capacity per shard in transitions")
    p.add_argument("--batch-size", type=int, default=64, help="transitions per gradient step")
    p.add_argument("--samples-per-insert", type=float, default=32.0, help="replay ratio: rows sampled per row written")
    p.add_argument("--min-size", type=int, default=1_000, help="rows in the buffer before the first sample")
    p.add_argument(
        "--error-buffer", type=float, default=8_192.0, help="the limiter's slack, in sampled rows, around the ratio"
    )
    p.add_argument(
        "--server-limiter",
        action="store_true",
        help="hand the limiter to RemoteBuffer.launch(rate_limiter=...): the buffer admits writes and draws",
    )
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decay the learning rate linearly to 0 over --total-steps",
    )
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--n-step", type=int, default=3, help="the actors write n-step transitions (Ape-X: 3)")
    p.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers of the Q-network")
    p.add_argument("--alpha", type=float, default=0.6, help="priority exponent (Ape-X: 0.6)")
    p.add_argument("--beta", type=float, default=0.4, help="importance-weight exponent (Ape-X: 0.4)")
    p.add_argument("--target-network-frequency", type=int, default=128, help="updates between target syncs")
    p.add_argument("--broadcast-every", type=int, default=25, help="updates between weight broadcasts")
    p.add_argument("--max-grad-norm", type=float, default=10.0, help="gradient-norm clip (0 disables)")
    p.add_argument("--eps-base", type=float, default=0.4, help="Ape-X's epsilon base: eps_i = base ** (1 + a i/(N-1))")
    p.add_argument("--eps-alpha", type=float, default=7.0, help="Ape-X's epsilon exponent range a")
    p.add_argument("--writer-batch", type=int, default=32, help="rows an actor's writer batches into one add_batch")
    p.add_argument("--flush-every-s", type=float, default=0.05, help="an actor's writer sends what it holds after this")
    p.add_argument("--eval-every", type=int, default=2_000, help="env steps between greedy evaluations")
    p.add_argument("--eval-episodes", type=int, default=5, help="greedy episodes per periodic evaluation")
    p.add_argument("--final-episodes", type=int, default=20, help="greedy episodes of the final evaluation")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads of the learner (small nets: 1)")
    p.add_argument("--plot", default="runs/apex_dqn.png", help="learning-curve PNG path ('' to skip)")
    p.add_argument("--summary", default="", metavar="PATH", help="also write the run's numbers as JSON to PATH")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (also off when not a TTY)")
    args = p.parse_args(argv)
    if args.num_actors < 1 or args.num_shards < 1 or args.total_steps < args.num_actors:
        p.error("--num-actors and --num-shards must be >= 1, --total-steps >= --num-actors")
    if not args.server_limiter and args.buffer_size * args.num_shards < args.total_steps:
        # LearnerGate counts the rows the handle holds as inserts, exact only while no ring has wrapped.
        p.error("--buffer-size * --num-shards must hold --total-steps (the learner counts inserts by rows held)")
    if args.min_size < args.batch_size or args.min_size > args.total_steps:
        p.error("--min-size must lie in [--batch-size, --total-steps]")
    return args


if __name__ == "__main__":
    parse_args()  # --help and argument errors answer here, before torch and gymnasium load (seconds)

import gymnasium as gym
import numpy as np
import ray
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import Tensor, nn
from tqdm import tqdm

from objectrl_buffer import PrioritizedReplayBuffer
from objectrl_buffer.distributed import RemoteBuffer
from objectrl_buffer.errors import RateLimitTimeout
from objectrl_buffer.flow import SampleToInsertRatio


class QNetwork(nn.Module):
    """obs [B, obs_dim] -> Q-values [B, n_actions]."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions)
        )

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


def apex_epsilons(n: int, base: float, alpha: float) -> list[float]:
    """Ape-X's per-actor exploration rates ``base ** (1 + alpha * i / (n - 1))`` (one actor: ``base``)."""
    return [base ** (1 + alpha * i / (n - 1)) if n > 1 else base for i in range(n)]


def numpy_state(module: nn.Module) -> dict[str, np.ndarray]:
    """A state dict as NumPy arrays: what goes into Ray's object store (zero-copy reads on the other side)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


# ----------------------------------------------------------------------------------------- actors
class ApexActor:
    """One Ape-X actor, a Ray actor with two threads: :meth:`run` steps the env and writes; :meth:`sync`
    (called by the learner) hands in new weights and how far the actor may step, and returns its progress.

    Rows (one per env step): ``state`` float32 [4], ``action`` int64, ``reward`` float32 (the discounted
    ``n``-step return), ``next_state`` float32 [4] (the state ``k <= n`` steps later), ``gamma_n`` float32
    (``gamma ** k``, 0 when the episode terminated in between) and ``actor`` int64 (who wrote it).
    """

    def __init__(self, index: int, epsilon: float, quota: int, handle: RemoteBuffer, args: argparse.Namespace) -> None:
        torch.set_num_threads(1)
        self.index, self.epsilon, self.quota, self.handle, self.args = index, epsilon, quota, handle, args
        self.rng = np.random.default_rng(args.seed + 1000 * (index + 1))
        torch.manual_seed(args.seed + 1000 * (index + 1))
        self.env = gym.make("CartPole-v1")
        self.env.action_space.seed(args.seed + index)
        assert isinstance(self.env.observation_space, gym.spaces.Box)
        assert isinstance(self.env.action_space, gym.spaces.Discrete)
        self.n_actions = int(self.env.action_space.n)
        self.q_network = QNetwork(self.env.observation_space.shape[0], self.n_actions, args.hidden)
        self.cond = threading.Condition()
        self.steps = 0  # env steps taken (== rows handed to the writer once run() has flushed)
        self.allowed = 0  # env steps the learner's limiter admits so far
        self.weights: dict[str, np.ndarray] | None = None  # newest broadcast, not yet loaded
        self.episodes: list[tuple[int, float]] = []  # (own env steps at the end, return) since the last sync
        self.done = False

    def sync(self, weights: dict[str, np.ndarray] | None, allowed: int) -> tuple[int, list[tuple[int, float]], bool]:
        """New weights (``None``: unchanged) and the env steps allowed; returns ``(steps, episodes, done)``."""
        with self.cond:
            if weights is not None:
                self.weights = weights
            self.allowed = max(self.allowed, allowed)
            self.cond.notify_all()
            episodes, self.episodes = self.episodes, []
            return self.steps, episodes, self.done

    def act(self, obs: np.ndarray) -> int:
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_actions))
        with torch.no_grad():
            return int(self.q_network(torch.from_numpy(obs)).argmax())

    def run(self) -> int:
        """Step until ``quota`` env steps are written; returns the steps taken."""
        args, gamma, window = self.args, self.args.gamma, self.args.n_step
        pending: deque[tuple[np.ndarray, int, float]] = deque()  # the last < n (obs, action, reward)

        def emit(next_obs: np.ndarray, terminated: bool) -> None:
            """The oldest pending step as an n-step row, then drop it."""
            ret = sum(r * gamma**j for j, (_, _, r) in enumerate(pending))
            obs, action, _ = pending.popleft()
            bootstrap = 0.0 if terminated else gamma ** (len(pending) + 1)
            writer.add({
                "state": obs, "action": np.int64(action), "reward": np.float32(ret), "next_state": next_obs,
                "gamma_n": np.float32(bootstrap), "actor": np.int64(self.index),
            })  # fmt: skip

        obs, _ = self.env.reset(seed=args.seed + 7919 * (self.index + 1))
        episode_return = 0.0
        with self.handle.writer(batch_size=args.writer_batch, flush_every_s=args.flush_every_s) as writer:
            while self.steps < self.quota:
                if self.steps >= self.allowed:
                    writer.flush()  # the learner counts only rows the buffer holds: hand them over before waiting
                    with self.cond:
                        self.cond.wait_for(lambda: self.steps < self.allowed, timeout=0.1)
                    continue
                if self.weights is not None:  # a broadcast came in (the lock: sync() may replace it meanwhile)
                    with self.cond:
                        weights, self.weights = self.weights, None
                    if weights is not None:  # copies: the arrays Ray hands over are read-only views of its store
                        self.q_network.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
                action = self.act(obs)
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                self.steps += 1
                episode_return += float(reward)
                pending.append((obs, action, float(reward)))
                if len(pending) == window:
                    emit(next_obs, bool(terminated))
                if terminated or truncated:
                    while pending:
                        emit(next_obs, bool(terminated))
                    with self.cond:
                        self.episodes.append((self.steps, episode_return))
                    episode_return = 0.0
                    next_obs, _ = self.env.reset()
                obs = next_obs
            while pending:  # the run ends mid-episode: bootstrap from where it stopped
                emit(obs, False)
        with self.cond:
            self.done = True
        return self.steps


# ----------------------------------------------------------------------------------------- the replay ratio
class LearnerGate:
    """The replay ratio kept in the learner with ``limiter`` (the default; ``--server-limiter`` hands it to
    ``RemoteBuffer.launch`` instead): the rows ``handle`` holds count as inserts, the learner's draws as samples.

    :meth:`try_sample` admits a draw by the limiter's rule; :meth:`budget` is how many inserts it would admit
    in all, what the actors may step to. Both sides of Reverb's ``SampleToInsertRatio`` hold: the learner never
    samples more than ``(inserts - min_size) * spi + error_buffer`` rows, the actors never write past
    ``(samples + min_size * spi + error_buffer) / spi``.
    """

    def __init__(self, limiter: SampleToInsertRatio, handle: RemoteBuffer) -> None:
        self.limiter, self.handle, self.rows = limiter, handle, 0

    def count_inserts(self) -> int:
        """Count the rows written since the last call as inserts (one round trip to each shard)."""
        rows = len(self.handle)  # every insert, as no ring wraps (parse_args checks the capacity)
        if rows > self.rows:
            if not self.limiter.try_insert(rows - self.rows):
                raise RuntimeError(f"the actors wrote past their budget: {rows} rows, {self.limiter!r}")
            self.rows = rows
        return rows

    def try_sample(self, n: int) -> bool:
        """Count ``n`` sampled rows if the ratio admits them, looking for new inserts first if it does not."""
        if self.limiter.try_sample(n):
            return True
        self.count_inserts()
        return self.limiter.try_sample(n)

    def budget(self) -> int:
        """Inserts the limiter would admit in all now (Reverb's insert rule solved for the count)."""
        lim = self.limiter
        most = (lim.max_diff + lim.samples) / lim.samples_per_insert
        total = max(lim.min_size_to_sample, math.floor(most) if math.isfinite(most) else sys.maxsize)
        while total > lim.inserts and not lim.can_insert(total - lim.inserts):  # float rounding: trust the rule
            total -= 1
        return max(total, lim.inserts)


# ----------------------------------------------------------------------------------------- learner
@dataclass
class Curve:
    """What the plot and the summary show."""

    episodes: list[tuple[int, int, float]] = field(default_factory=list)  # (env steps, actor, return)
    evals: list[tuple[int, float, float]] = field(default_factory=list)  # (env steps, greedy mean, wall s)

    def solved_at(self) -> tuple[int, float] | None:
        """``(env steps, wall s)`` of the evaluation from which on every one is >= 195 (``None``: the last is not)."""
        solved = None
        for steps, mean, seconds in self.evals:
            solved = (solved or (steps, seconds)) if mean >= SOLVED_RETURN else None
        return solved


def double_dqn_loss(batch: TensorDict, q_network: nn.Module, target_network: nn.Module) -> tuple[Tensor, Tensor]:
    """Importance-weighted Huber loss of a sampled batch ``[B]`` and its TD errors ``[B]`` (for priorities)."""
    with torch.no_grad():
        best = q_network(batch["next_state"]).argmax(dim=1, keepdim=True)  # the online net picks ...
        next_value = target_network(batch["next_state"]).gather(1, best).squeeze(1)  # ... the target values it
        td_target = batch["reward"] + batch["gamma_n"] * next_value
    q_value = q_network(batch["state"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    loss = (batch["weight"] * F.smooth_l1_loss(q_value, td_target, reduction="none")).mean()
    return loss, (td_target - q_value).detach()


def evaluate(q_network: nn.Module, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` greedy episodes (the learner's network, no exploration)."""
    env = gym.make("CartPole-v1")
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, over = 0.0, False
        while not over:
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            over = bool(terminated or truncated)
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def plot_learning_curve(curve: Curve, epsilons: list[float], path: str, title: str) -> bool:
    """Actors' episode returns and the greedy evaluations against env steps; ``False`` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, eps in enumerate(epsilons):
        points = np.asarray([(s, r) for s, a, r in curve.episodes if a == i]).reshape(-1, 2)
        ax.plot(points[:, 0], points[:, 1], ".", markersize=3, alpha=0.4, label=f"actor {i} (eps {eps:.3g})")
    if curve.evals:
        steps, means, _ = zip(*curve.evals, strict=True)
        ax.plot(steps, means, "o-", color="black", linewidth=2, label="greedy evaluation (mean)")
    ax.axhline(SOLVED_RETURN, color="tab:red", linestyle="--", linewidth=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set(xlabel="env steps (all actors)", ylabel="return", title=title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> float:
    """Train, report, and return the greedy mean return of the final evaluation."""
    args = parse_args(argv)
    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        return train(args, wall_start)
    finally:
        if started_ray:
            ray.shutdown()


def train(args: argparse.Namespace, wall_start: float) -> float:
    env = gym.make("CartPole-v1")
    assert isinstance(env.observation_space, gym.spaces.Box) and isinstance(env.action_space, gym.spaces.Discrete)
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    env.close()
    q_network = QNetwork(obs_dim, n_actions, args.hidden)
    target_network = QNetwork(obs_dim, n_actions, args.hidden)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)

    limiter = SampleToInsertRatio(args.samples_per_insert, args.min_size, args.error_buffer)
    extra: dict[str, Any] = {"rate_limiter": limiter} if args.server_limiter else {}
    handle = RemoteBuffer.launch(
        PrioritizedReplayBuffer, "cpu", "cpu", args.buffer_size, num_shards=args.num_shards,
        alpha=args.alpha, beta=args.beta, seed=args.seed,
        **extra,
    )  # fmt: skip
    gate = None if args.server_limiter else LearnerGate(limiter, handle)

    epsilons = apex_epsilons(args.num_actors, args.eps_base, args.eps_alpha)
    quotas = [
        args.total_steps // args.num_actors + (i < args.total_steps % args.num_actors) for i in range(args.num_actors)
    ]
    remote_actor = ray.remote(ApexActor).options(max_concurrency=2, num_cpus=0)  # processes, not CPU reservations
    actors: list[Any] = [remote_actor.remote(i, epsilons[i], quotas[i], handle, args) for i in range(args.num_actors)]
    runs = [actor.run.remote() for actor in actors]

    weights_ref, weights_version = ray.put(numpy_state(q_network)), 0
    sent = [-1] * args.num_actors  # the weights version each actor holds
    in_flight: dict[int, Any] = {}  # actor -> its sync call on its way (one each at most)
    last_sync = [0.0] * args.num_actors
    steps, done = [0] * args.num_actors, [False] * args.num_actors
    curve = Curve()
    next_eval = args.eval_every

    def exchange() -> None:
        """Collect the actors' answered syncs and send the next ones (new weights, a grown budget)."""
        if in_flight:
            ready, _ = ray.wait(list(in_flight.values()), num_returns=len(in_flight), timeout=0)
            for i in [i for i, ref in in_flight.items() if ref in ready]:
                steps[i], episodes, done[i] = ray.get(in_flight.pop(i))
                curve.episodes.extend((sum(steps), i, ret) for _, ret in episodes)
        budget = sum(quotas) if gate is None else gate.budget()
        now = time.monotonic()
        for i, actor in enumerate(actors):
            if i in in_flight or done[i] or now - last_sync[i] < SYNC_PERIOD_S:
                continue
            share = min(quotas[i], budget * quotas[i] // sum(quotas))  # each actor its share of the budget
            in_flight[i] = actor.sync.remote(weights_ref if sent[i] != weights_version else None, share)
            sent[i], last_sync[i] = weights_version, now

    progress = tqdm(
        total=args.total_steps, desc="Ape-X DQN CartPole-v1", disable=args.no_progress or not sys.stderr.isatty()
    )
    batches = None
    updater = ThreadPoolExecutor(max_workers=1)  # priority updates off the learner's path
    updating: Future[int] | None = None
    updates = applied = idle_polls = 0
    actor_rows_seen = np.zeros(args.num_actors, dtype=np.int64)  # sampled rows by who wrote them
    while True:
        exchange()
        progress.update(sum(steps) - progress.n)
        if sum(steps) >= next_eval:  # a greedy evaluation of the learner's current network
            mean = evaluate(q_network, args.eval_episodes, args.seed + 10_000 + next_eval)
            curve.evals.append((next_eval, mean, time.perf_counter() - wall_start))
            progress.set_postfix(updates=updates, eval=f"{mean:.0f}")
            tqdm.write(f"env step {next_eval}: greedy mean return {mean:.1f} ({updates} updates, "
                       f"{time.perf_counter() - wall_start:.0f} s)")  # fmt: skip
            next_eval += args.eval_every
        if gate is None:  # the buffer's limiter holds the draws until the ratio admits them
            if all(done):
                break
            if sum(steps) < args.min_size:  # no draw is admitted before --min-size rows: don't wait on one
                idle_polls += 1
                time.sleep(0.002)
                continue
        elif not gate.try_sample(args.batch_size):
            if all(done) and gate.count_inserts() == sum(quotas):
                break  # every row is in and the ratio admits no more draws: the run is over
            idle_polls += 1
            ray.get(ray.wait(runs, num_returns=len(runs), timeout=0)[0])  # an actor that failed raises here
            time.sleep(0.002)  # the actors are behind the ratio: let them write
            continue
        if batches is None:  # the first admitted draw: the buffer holds --min-size rows by now
            timeout = SAMPLE_TIMEOUT_S if gate is None else None
            batches = handle.prefetch(args.batch_size, depth=PREFETCH_DEPTH, timeout=timeout)
        try:
            batch = next(batches)
        except RateLimitTimeout:  # --server-limiter: the actors are behind the ratio (or done); the stream ended
            batches = None
            idle_polls += 1
            ray.get(ray.wait(runs, num_returns=len(runs), timeout=0)[0])  # an actor that failed raises here
            continue
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * max(0.0, 1.0 - sum(steps) / args.total_steps)
        loss, td_error = double_dqn_loss(batch, q_network, target_network)
        optimizer.zero_grad()
        loss.backward()
        if args.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        # The priority update travels while the next step computes (one in flight; the thread keeps them in order).
        if updating is not None:
            applied += updating.result()
        updating = updater.submit(handle.update_priority, batch["index"], td_error.abs(), batch["generation"])
        actor_rows_seen += np.bincount(batch["actor"].numpy(), minlength=args.num_actors)
        updates += 1
        if updates % args.target_network_frequency == 0:
            target_network.load_state_dict(q_network.state_dict())
        if updates % args.broadcast_every == 0:
            weights_ref, weights_version = ray.put(numpy_state(q_network)), weights_version + 1  # the old ref goes
    progress.close()
    if updating is not None:
        applied += updating.result()
    updater.shutdown()
    written = ray.get(runs)  # each actor's steps; raises here if an actor failed
    for ref in in_flight.values():
        ray.get(ref)
    if isinstance(batches, Generator):
        batches.close()  # stops the prefetch thread; its samples in flight are dropped
    rows_held, priority_mass = map(sum, zip(*handle.masses(), strict=True))
    if gate is None:  # the buffer's limiter counted; mirror its counters here for the report
        limiter.restore({}, handle.limiter_counters())
    final = evaluate(q_network, args.final_episodes, args.seed + 99_999)
    handle.kill()
    wall = time.perf_counter() - wall_start

    if args.plot:
        title = f"Ape-X DQN CartPole-v1 (objectrl_buffer), seed {args.seed}, {args.total_steps} env steps"
        if plot_learning_curve(curve, epsilons, args.plot, title):
            print(f"learning curve: {args.plot}")
    ratio = limiter.samples / max(1, limiter.inserts - limiter.min_size_to_sample)
    print(f"actors: {args.num_actors} (epsilons {', '.join(f'{e:.3g}' for e in epsilons)}), rows written {written}")
    print(f"buffer: {int(rows_held)} rows in {args.num_shards} shard(s), priority mass {priority_mass:.1f}")
    print(f"learner: {updates} updates of {args.batch_size}, sampled rows by actor {actor_rows_seen.tolist()}")
    print(f"priority updates applied: {applied}; the learner waited for the actors {idle_polls} times")
    where = "the learner's gate" if gate is not None else "the buffer's limiter"
    print(
        f"replay ratio: {ratio:.2f} sampled rows per row inserted past --min-size "
        f"(target {args.samples_per_insert:g}; {where}: {limiter!r})"
    )
    print(f"greedy evaluations: {', '.join(f'{s}: {m:.0f}' for s, m, _ in curve.evals)}")
    solved = curve.solved_at()
    if solved is not None:
        print(f"every evaluation >= {SOLVED_RETURN:g} from env step {solved[0]} on ({solved[1]:.1f} s)")
    print(f"wall time: {wall:.1f} s")
    if args.summary:  # what docs/apex_dqn.json holds, so the README can quote the run it shows
        summary = {
            "seed": args.seed,
            "total_steps": args.total_steps,
            "num_actors": args.num_actors,
            "num_shards": args.num_shards,
            "epsilons": [round(e, 5) for e in epsilons],
            "rows_written": written,
            "rows_held": int(rows_held),
            "priority_mass": round(float(priority_mass), 3),
            "sampled_rows_by_actor": actor_rows_seen.tolist(),
            "updates": updates,
            "batch_size": args.batch_size,
            "priority_updates_applied": applied,
            "samples_per_insert": args.samples_per_insert,
            "server_limiter": args.server_limiter,
            "limiter": {k: getattr(limiter, k) for k in ("inserts", "samples", "diff", "min_diff", "max_diff")},
            "replay_ratio": round(ratio, 3),
            "evaluations": [[s, round(m, 1)] for s, m, _ in curve.evals],
            "solved_from_step": None if solved is None else solved[0],  # every evaluation >= 195 from here on
            "solved_from_s": None if solved is None else round(solved[1], 1),
            "final_episodes": args.final_episodes,
            "mean_return": round(final, 1),
            "wall_s": round(wall, 1),
            "plot": args.plot,
        }
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary, indent=1) + "\n")
        print(f"summary: {args.summary}")
    verdict = "met" if final >= SOLVED_RETURN else "NOT met"
    print(f"criterion mean greedy return >= {SOLVED_RETURN:g}: {verdict}")
    print(f"mean greedy return over {args.final_episodes} evaluation episodes: {final:.1f}")
    return final


if __name__ == "__main__":
    main()
