"""RLinf's own code for the compat tests, loaded from the rlinf 0.3.0 wheel at run time (never copied here).

:func:`io` is ``rlinf/data/embodied_io_struct.py`` (RLinf's ``Trajectory`` with ``extract_intervene_traj()``,
``EmbodiedRolloutResult``, ``ChunkStepResult``) over ``rlinf/utils/nested_dict_process.py`` (its
``concat_batch``), both pure torch/NumPy; :func:`upstream` is rlinf's ``TrajectoryReplayBuffer`` module
(:mod:`benchmarks.rlinf_peer`). Both skip the test when the wheel cannot be had (offline, no cache).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import rlinf_peer

_FILES = ("rlinf/utils/nested_dict_process.py", "rlinf/data/embodied_io_struct.py")


def _download() -> bool:
    return not os.environ.get("OBJECTRL_BUFFER_NO_DOWNLOAD")


def upstream() -> Any:
    """rlinf 0.3.0's ``replay_buffer`` module, or a skip."""
    try:
        return rlinf_peer.load(download=_download())
    except rlinf_peer.Unavailable as exc:
        pytest.skip(str(exc))


def _extracted() -> Path:
    """The folder holding :data:`_FILES` unpacked from the wheel (the one rlinf_peer uses)."""
    try:
        module = rlinf_peer.module_path(download=_download())  # .../rlinf-0.3.0/rlinf/data/replay_buffer.py
    except rlinf_peer.Unavailable as exc:
        pytest.skip(str(exc))
    root = module.parents[2]
    if not all((root / name).exists() for name in _FILES):
        wheels = sorted(Path(rlinf_peer.DEFAULT_CACHE).glob(f"rlinf-{rlinf_peer.RLINF_VERSION}-*.whl"))
        if not wheels:
            pytest.skip("the rlinf wheel is gone from the cache")
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in _FILES:
                zf.extract(name, root)
    return root


def io() -> Any:
    """RLinf 0.3.0's ``embodied_io_struct`` module (its ``concat_batch`` attached as ``io.concat_batch``)."""
    name = "rlinf_upstream_embodied_io_struct"
    if name in sys.modules:
        return sys.modules[name]
    root = _extracted()
    stubs = {key: types.ModuleType(key) for key in ("rlinf", "rlinf.utils", "rlinf.utils.nested_dict_process")}
    helpers = _exec("rlinf.utils.nested_dict_process", root / _FILES[0])
    with rlinf_peer.stubbed(stubs):
        sys.modules["rlinf.utils.nested_dict_process"] = helpers
        module = _exec(name, root / _FILES[1])
    module.concat_batch = helpers.concat_batch
    sys.modules[name] = module
    return module


def _exec(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rollout(
    module: Any,
    *,
    B: int = 3,
    steps: int = 4,
    epochs: int = 1,
    seed: int = 0,
    intervene: frozenset[tuple[int, int]] = frozenset(),
) -> Any:
    """A trajectory as RLinf's rollout worker builds it, with RLinf's own classes (``module`` = :func:`io`):
    ``epochs`` epochs of ``steps`` chunk steps of ``B`` envs, each epoch opening with a done-only row (so the
    done-like fields have ``T + epochs`` rows), ``versions`` set; a human takes over env ``b`` at step ``t``
    for each ``(t, b)`` in ``intervene`` (``update_last_actions``, which sets ``intervene_flags``)."""
    g = torch.Generator().manual_seed(seed)
    result = module.EmbodiedRolloutResult(max_episode_length=steps * epochs)
    t = 0
    for _ in range(epochs):
        start = torch.zeros(B, 1, dtype=torch.bool)
        result.append_step_result(module.ChunkStepResult(dones=start, terminations=start, truncations=start))
        for _ in range(steps):
            obs = {
                "states": torch.randn(B, 3, generator=g),
                "main_images": torch.randint(0, 255, (B, 3, 8, 8), generator=g).byte(),
            }
            nxt = {
                "states": torch.randn(B, 3, generator=g),
                "main_images": torch.randint(0, 255, (B, 3, 8, 8), generator=g).byte(),
            }
            actions = torch.randn(B, 2, generator=g)
            done = torch.rand(B, 1, generator=g) < 0.2
            result.append_step_result(
                module.ChunkStepResult(
                    actions=actions,
                    prev_logprobs=torch.randn(B, 2, generator=g),
                    rewards=torch.randn(B, 1, generator=g),
                    dones=done,
                    terminations=done,
                    truncations=torch.zeros(B, 1, dtype=torch.bool),
                    forward_inputs={"action": actions.clone()},
                    versions=torch.full((B, 1), float(seed + 1)),
                )
            )
            result.append_transitions(curr_obs=obs, next_obs=nxt)
            flags = torch.tensor([(t, b) in intervene for b in range(B)])
            if bool(flags.any()):
                result.update_last_actions(torch.ones(B, 2), flags)
            t += 1
    return result.to_trajectory()
