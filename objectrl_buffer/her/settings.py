"""HER's relabeling settings in full checkpoints, so ``HerReplayBuffer.from_checkpoint`` resumes with them.

The strategy, ``n_sampled_goal``, the goal keys and ``info_keys`` are saved as JSON values under ``her.*``
(:mod:`~objectrl_buffer.checkpoint.extras`); ``compute_reward`` is code and is passed again. Arguments given to
``from_checkpoint`` win over the saved ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from objectrl_buffer.checkpoint.extras import Arrays, Values
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.core.schema import Key
from objectrl_buffer.errors import CheckpointError

if TYPE_CHECKING:
    from objectrl_buffer.her.buffer import HerReplayBuffer

NAME = "her"
_KEYS = ("achieved_goal_key", "desired_goal_key", "next_achieved_goal_key", "next_desired_goal_key")


def _encode(key: Key | None) -> Any:
    return list(key) if isinstance(key, tuple) else key


def _decode(raw: Any) -> Key | None:
    return tuple(raw) if isinstance(raw, list) else raw


class HerSettings:
    """The :class:`~objectrl_buffer.checkpoint.extras.ExtraState` of a :class:`HerReplayBuffer`'s settings."""

    name = NAME

    def __init__(self, buffer: HerReplayBuffer) -> None:
        self.buffer = buffer

    def state(self) -> tuple[Arrays, Values]:
        b = self.buffer
        values: dict[str, ExtraValue] = {
            "goal_selection_strategy": b.goal_selection_strategy.value,
            "n_sampled_goal": b.n_sampled_goal,
            "info_keys": json.dumps([_encode(k) for k in b.info_keys]),
        }
        for name in _KEYS:
            values[name] = json.dumps(_encode(getattr(b, name)))
        return {}, values

    def check(self, arrays: Arrays, values: Values, rows: int, source: str) -> None:
        """Nothing to refuse: the settings are read (and checked) by :meth:`settings` before the buffer exists."""

    def restore(self, arrays: Arrays, values: Values) -> None:
        """Nothing to adopt: the settings became constructor arguments."""

    @staticmethod
    def settings(values: Mapping[str, ExtraValue], folder: str | None) -> dict[str, Any]:
        """The saved constructor arguments (those not given to ``from_checkpoint``); none for a checkpoint
        of another buffer.

        Raises:
            CheckpointError: a saved value that is not JSON of the expected shape, naming ``folder``.
        """
        out: dict[str, Any] = {}
        try:
            for name in _KEYS:
                raw = values.get(name)
                if isinstance(raw, str):
                    out[name] = _decode(json.loads(raw))
            raw_infos = values.get("info_keys")
            if isinstance(raw_infos, str):
                out["info_keys"] = tuple(_decode(k) for k in json.loads(raw_infos))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"'{folder}': a saved HER setting is not valid JSON: {exc}") from None
        if "goal_selection_strategy" in values:
            out["goal_selection_strategy"] = values["goal_selection_strategy"]
        if "n_sampled_goal" in values:
            out["n_sampled_goal"] = values["n_sampled_goal"]
        return out
