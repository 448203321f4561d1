"""HerReplayBuffer: hindsight experience replay (Andrychowicz et al. 2017) with Stable-Baselines3's semantics.

Rows are stored as the plain :class:`~objectrl_buffer.ReplayBuffer` stores them (nothing extra per row);
at sample time the rows of finished episodes are drawn uniformly, and a fixed share of them,
``her_ratio = 1 - 1 / (n_sampled_goal + 1)``, gets a new desired goal (an achieved goal of the same
episode, chosen by the strategy) and the reward the user's ``compute_reward`` gives for it. Which rows
are drawn and which goals they get: :mod:`objectrl_buffer.sampling.her`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.core.schema import Key, Schema, format_key
from objectrl_buffer.core.validate import integer, positive_int
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError
from objectrl_buffer.her.settings import HerSettings
from objectrl_buffer.replay_buffer import ReplayBuffer
from objectrl_buffer.sampling.her import (
    Drawable,
    GoalSelectionStrategy,
    draw_goal_steps,
    draw_rows,
    drawable_steps,
    goal_strategy,
    oldest_row_starts,
)
from objectrl_buffer.sampling.slices import StoredRows, TransitionKeys, require_keys

__all__ = ["HerReplayBuffer", "ComputeReward"]

#: ``compute_reward(achieved_goal [n, *goal], desired_goal [n, *goal], infos: list of n dicts) -> [n] rewards``
#: (a tensor, a NumPy array or a sequence of numbers), as a gymnasium ``GoalEnv``'s method.
ComputeReward = Callable[[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]], Any]


def _key(value: object, name: str) -> Key:
    if isinstance(value, str) or (isinstance(value, tuple) and value and all(isinstance(p, str) for p in value)):
        return value[0] if isinstance(value, tuple) and len(value) == 1 else value
    raise InvalidArgumentError(f"{name} must be a key (a str or a tuple of str), got {value!r}")


def _next_twin(key: Key) -> Key:
    """``"achieved_goal" -> "next_achieved_goal"``; nested: ``("observation", "x") -> ("next_observation", "x")``."""
    return f"next_{key}" if isinstance(key, str) else (f"next_{key[0]}", *key[1:])


class HerReplayBuffer(ReplayBuffer):
    """A replay buffer that relabels goals in hindsight at sample time (SB3's ``HerReplayBuffer``).

    Write transitions as to :class:`~objectrl_buffer.ReplayBuffer` (``add``/``add_batch``; with
    ``num_envs > 1`` each env is its own stream), with the goal keys of a gymnasium goal env flattened
    into the row: ``observation``, ``achieved_goal``, ``desired_goal`` and their ``next_`` twins, plus
    ``action``, ``reward``, ``terminated`` and ``truncated`` (names from ``transition_keys``).

    :meth:`sample_batch` draws ``batch_size`` rows uniformly with replacement among the rows of
    *finished* episodes (SB3: an episode is sampled once its end is written; the episode being written
    is not drawn, nor is one whose first row the ring has overwritten). The last
    ``int(her_ratio * batch_size)`` rows of the batch are relabeled: ``desired_goal`` and
    ``next_desired_goal`` become the ``next_achieved_goal`` of a step of the same episode (``future``:
    uniform over the steps from the row's own one to the episode's last, inclusive; ``final``: the last;
    ``episode``: uniform over all), and ``reward`` becomes ``compute_reward(next_achieved_goal,
    new_goal, infos)``, called once for all of them. The first rows are real, unchanged (their stored
    reward is kept, as SB3 does). ``terminated``/``truncated`` are never changed.

    Args:
        device, storing_device, buffer_size: as :class:`~objectrl_buffer.ReplayBuffer`.
        compute_reward: the reward of achieving ``achieved`` when the goal is ``desired``, vectorised:
            ``compute_reward(achieved [n, *goal], desired [n, *goal], infos)`` with tensors on ``device``
            and ``infos`` a list of ``n`` dicts (empty unless ``info_keys``), returning ``n`` rewards
            (tensor, NumPy array or sequence; cast to the stored reward's dtype and row shape).
        n_sampled_goal: relabeled rows per real one (an int >= 0): ``her_ratio = 1 - 1 / (n_sampled_goal + 1)``
            (4: 80 % relabeled; 0: no relabeling).
        goal_selection_strategy: ``"future"``, ``"final"`` or ``"episode"`` (any case), a
            :class:`~objectrl_buffer.sampling.her.GoalSelectionStrategy`, or SB3's enum.
        achieved_goal_key, desired_goal_key: the stored goal keys (str, or a tuple for nested keys).
        next_achieved_goal_key, next_desired_goal_key: their twins after the step; by default (``None`` and
            ``""``) ``"next_"`` before the key, or before its first part if nested (``("obs", "goal")`` ->
            ``("next_obs", "goal")``). ``next_desired_goal_key=None``: no such key is stored.
        info_keys: stored keys whose row values fill each relabeled row's info dict (keyed by
            ``format_key``); empty dicts by default, as SB3 without ``copy_info_dict``.
        seed, shuffle, storage_dir, transition_keys, num_envs, rate_limiter: as :class:`~objectrl_buffer.ReplayBuffer`.

    The goals, the reward and the episode ends must be stored by the first :meth:`sample_batch`
    (``SchemaError`` naming the key otherwise). ``sample_by_index``, slices, ``sample_all`` and the epoch
    iterators return stored rows, not relabeled. A sample reads the episode-end flags around the rows it
    draws and at the ends of each env's stream (``O(batch_size * episode length)``), never all rows.

    Raises:
        InvalidArgumentError: naming the argument: ``compute_reward`` not callable, ``n_sampled_goal``
            not an int >= 0, an unknown ``goal_selection_strategy``, a key that is not a key; and as
            :class:`~objectrl_buffer.ReplayBuffer`.
    """

    #: ``from_checkpoint`` reads the saved relabeling settings back (:mod:`~objectrl_buffer.her.settings`).
    extra_state_types = (*ReplayBuffer.extra_state_types, HerSettings)

    def __init__(
        self,
        device: torch.device | str,
        storing_device: torch.device | str,
        buffer_size: int,
        *,
        compute_reward: ComputeReward,
        n_sampled_goal: int = 4,
        goal_selection_strategy: GoalSelectionStrategy | str | object = "future",
        achieved_goal_key: Key = "achieved_goal",
        desired_goal_key: Key = "desired_goal",
        next_achieved_goal_key: Key | None = None,
        next_desired_goal_key: Key | None = "",
        info_keys: Sequence[Key] = (),
        seed: int | None = None,
        shuffle: bool = False,
        storage_dir: str | os.PathLike[str] | None = None,
        transition_keys: TransitionKeys | None = None,
        num_envs: int = 1,
        rate_limiter: Any = None,
    ) -> None:
        if not callable(compute_reward):
            raise InvalidArgumentError(f"compute_reward must be callable, got {compute_reward!r}")
        count = integer(n_sampled_goal, "n_sampled_goal")
        if count < 0:
            raise InvalidArgumentError(f"n_sampled_goal must be an int >= 0, got {count}")
        strategy = goal_strategy(goal_selection_strategy)
        achieved = _key(achieved_goal_key, "achieved_goal_key")
        desired = _key(desired_goal_key, "desired_goal_key")
        next_achieved = (
            _next_twin(achieved)
            if next_achieved_goal_key is None
            else _key(next_achieved_goal_key, "next_achieved_goal_key")
        )
        next_desired: Key | None
        if next_desired_goal_key == "":
            next_desired = _next_twin(desired)
        else:
            next_desired = (
                None if next_desired_goal_key is None else _key(next_desired_goal_key, "next_desired_goal_key")
            )
        if isinstance(info_keys, (str, bytes)):
            raise InvalidArgumentError(f"info_keys must be a sequence of keys, got {info_keys!r}")
        infos = tuple(_key(k, "info_keys") for k in info_keys)
        super().__init__(
            device,
            storing_device,
            buffer_size,
            seed=seed,
            shuffle=shuffle,
            storage_dir=storage_dir,
            transition_keys=transition_keys,
            num_envs=num_envs,
            rate_limiter=rate_limiter,
        )
        self.compute_reward = compute_reward
        self.n_sampled_goal = count
        self.goal_selection_strategy = strategy
        self.achieved_goal_key = achieved
        self.desired_goal_key = desired
        self.next_achieved_goal_key = next_achieved
        self.next_desired_goal_key = next_desired
        self.info_keys = infos
        self._checked_schema: Schema | None = None  # the schema whose keys _check_keys accepted
        self.checkpoint_extras.append(HerSettings(self))  # full checkpoints keep the relabeling settings

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_checked_schema"] = None  # the schema object this buffer checked, not the copy's
        return state

    @property
    def her_ratio(self) -> float:
        """Share of each batch that is relabeled: ``1 - 1 / (n_sampled_goal + 1)``."""
        return 1.0 - 1.0 / (self.n_sampled_goal + 1)

    @property
    def sampleable_rows(self) -> int:
        """Rows :meth:`sample_batch` may draw now: those of finished episodes whose first row is held.

        Raises:
            SchemaError: an episode-end key (``transition_keys``) is not stored.
        """
        if self.engine.ring.held == 0 or self.engine.schema is None:
            return 0
        return self._drawable(self._stored_rows()).total

    def _stored_rows(self) -> StoredRows:
        engine = self.engine
        columns = engine.storage.columns
        end_keys = self.transition_keys.episode_end
        require_keys(columns, end_keys, "HerReplayBuffer")
        return StoredRows(columns, end_keys, engine.ring, self.num_envs)

    def _drawable(self, rows: StoredRows) -> Drawable:
        return drawable_steps(rows, oldest_row_starts(rows.ring), self.engine.storing_device)

    def sample_batch(
        self,
        batch_size: int,
        *,
        n_step: int | None = None,
        gamma: float = 0.99,
        recent: int | None = None,
        timeout: float | None = None,
    ) -> TensorDict:
        """``batch_size`` rows of finished episodes, the last ``int(her_ratio * batch_size)`` relabeled
        (see the class docs), with ``"index"`` (each row's slot), on ``device``. ``timeout``: as
        :meth:`ReplayBuffer.sample_batch` (for a ``rate_limiter``'s admission; ignored without one).

        Raises:
            InvalidArgumentError: a bad ``batch_size``; ``n_step`` or ``recent`` (not supported with HER).
            EmptyBufferError: no rows, or no episode has ended yet (as SB3's ``RuntimeError``).
            SchemaError: a goal, reward or episode-end key is not stored, or the goals' shapes differ.
        """
        k = positive_int(batch_size, "batch_size")
        for name, value in (("n_step", n_step), ("recent", recent)):
            if value is not None:
                raise InvalidArgumentError(f"{name} is not supported by HerReplayBuffer.sample_batch, got {value!r}")
        engine = self.engine
        engine.require_rows()
        self._check_keys()
        rows = self._stored_rows()
        drawable = self._drawable(rows)
        if drawable.total == 0:
            raise EmptyBufferError(
                f"no episode has ended among the {engine.ring.held} rows held: HerReplayBuffer samples only "
                "finished episodes; write an episode's end (terminated or truncated) first, e.g. sample only "
                "after more steps than an episode lasts"
            )
        generator = self.generator
        state = generator.get_state()  # restored if compute_reward fails: a failed call draws nothing
        try:
            steps, envs = draw_rows(drawable, k, generator)
            stride = self.num_envs
            batch = engine.read(rows.slots(steps * stride + envs))
            n_virtual = int(self.her_ratio * k)
            if n_virtual:
                real = k - n_virtual
                goals = draw_goal_steps(rows, steps[real:], envs[real:], self.goal_selection_strategy, generator)
                self._relabel(batch, real, rows.slots(goals * stride + envs[real:]))
        except BaseException:
            generator.set_state(state)
            raise
        return batch

    def _check_keys(self) -> None:
        schema = self.engine.schema
        assert schema is not None
        if schema is self._checked_schema:
            return
        fields = schema.by_key
        wanted: list[tuple[str, Key | None]] = [
            ("desired_goal_key", self.desired_goal_key),
            ("next_achieved_goal_key", self.next_achieved_goal_key),
            ("next_desired_goal_key", self.next_desired_goal_key),
            ("transition_keys.reward", self.transition_keys.reward),
        ]
        wanted += [("info_keys", key) for key in self.info_keys]
        for name, key in wanted:
            if key is not None and key not in fields:
                stored = [format_key(f) for f in fields]
                raise SchemaError(f"{name}: the key '{format_key(key)}' is not stored; stored keys: {stored}")
        goal = fields[self.desired_goal_key].describe()
        for name, key in (
            ("next_achieved_goal_key", self.next_achieved_goal_key),
            ("next_desired_goal_key", self.next_desired_goal_key),
        ):
            if key is not None and fields[key].describe() != goal:
                raise SchemaError(
                    f"{name}: '{format_key(key)}' stores {fields[key].describe()} per row but desired_goal_key "
                    f"'{format_key(self.desired_goal_key)}' stores {goal}: a goal must fit both"
                )
        self._checked_schema = schema

    def _relabel(self, batch: TensorDict, start: int, goal_slots: torch.Tensor) -> None:
        """Give rows ``start:`` of ``batch`` the goals at ``goal_slots`` and their recomputed reward, in place."""
        engine = self.engine
        goals = engine.read(goal_slots, [self.next_achieved_goal_key], with_index=False).get(
            self.next_achieved_goal_key
        )
        for key in (self.desired_goal_key, self.next_desired_goal_key):
            if key is not None:
                batch.get(key)[start:] = goals
        n = goals.shape[0]
        infos: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
        for key in self.info_keys:
            values = batch.get(key)[start:]
            for i, info in enumerate(infos):
                info[format_key(key)] = values[i]
        reward_key = self.transition_keys.reward
        reward = batch.get(reward_key)
        got = self.compute_reward(batch.get(self.next_achieved_goal_key)[start:], goals, infos)
        value = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got)
        shape = (n, *reward.shape[1:])
        if value.numel() != math.prod(shape):
            raise SchemaError(
                f"compute_reward returned {tuple(value.shape)} for {n} relabeled rows; "
                f"the reward '{format_key(reward_key)}' is stored as {tuple(reward.shape[1:])} per row"
            )
        reward[start:] = value.reshape(shape).to(device=reward.device, dtype=reward.dtype)
