"""rlinf 0.3.0's ``TrajectoryReplayBuffer``, loaded from its PyPI wheel at run time (never copied into the repo).

``rlinf/data/replay_buffer.py`` imports ``rlinf.data.embodied_io_struct.Trajectory`` (which pulls in much of
RLinf) and ``rlinf.utils.logging.get_logger``; small stubs stand in for both: the stub's ``Trajectory``
(:data:`RLINF_TRAJECTORY`, also the module's ``Trajectory``) is a dataclass of its own with RLinf 0.3's field
names and defaults, not this library's class, so a benchmark that feeds it to both buffers also shows that ours
takes RLinf's objects as they are. Used by
``benchmarks/trajectory_bench.py`` and the differential tests in ``tests/trajectory``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RLINF_VERSION = "0.3.0"
RLINF_MODULE = "rlinf/data/replay_buffer.py"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "objectrl_buffer", "rlinf")


class Unavailable(Exception):
    """The rlinf wheel could not be found or downloaded."""


def module_path(cache_dir: str = DEFAULT_CACHE, download: bool = True) -> Path:
    """Path of rlinf 0.3.0's ``replay_buffer.py`` unpacked from its wheel (downloaded with pip if needed)."""
    cache = Path(cache_dir)
    target = cache / f"rlinf-{RLINF_VERSION}" / RLINF_MODULE
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"rlinf-{RLINF_VERSION}-*.whl"))
    if not found and download:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"rlinf=={RLINF_VERSION}", "-d", str(cache), "-q"]
        subprocess.run(cmd, capture_output=True, timeout=300, check=False)
        found = sorted(cache.glob(f"rlinf-{RLINF_VERSION}-*.whl"))
    if not found:
        raise Unavailable(f"rlinf {RLINF_VERSION} wheel not available (pip download failed or offline)")
    with zipfile.ZipFile(found[0]) as zf:
        zf.extract(RLINF_MODULE, target.parents[2])
    return target


@contextlib.contextmanager
def stubbed(stubs: dict[str, types.ModuleType]) -> Iterator[None]:
    """``stubs`` in ``sys.modules`` while the block runs (what an upstream file imports), then the entries
    as they were (also any the block set under the same names)."""
    saved = {key: sys.modules.get(key) for key in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def _rlinf_trajectory() -> type:
    """A dataclass named ``Trajectory`` with the fields and defaults of ours (RLinf 0.3's), sharing no code."""
    from objectrl_buffer.trajectory import Trajectory

    specs: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(Trajectory):
        if f.default is not dataclasses.MISSING:
            specs.append((f.name, f.type, dataclasses.field(default=f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            specs.append((f.name, f.type, dataclasses.field(default_factory=f.default_factory)))
        else:
            specs.append((f.name, f.type, dataclasses.field()))
    return dataclasses.make_dataclass("Trajectory", specs)


#: The stub's ``Trajectory``: what RLinf code hands a replay buffer (see the module docs).
RLINF_TRAJECTORY: type = _rlinf_trajectory()


def load(cache_dir: str = DEFAULT_CACHE, download: bool = True) -> Any:
    """rlinf 0.3.0's ``replay_buffer`` module (its ``TrajectoryReplayBuffer`` and ``TrajectoryCache``)."""
    name = "rlinf_upstream_replay_buffer"
    if name in sys.modules:
        return sys.modules[name]
    path = module_path(cache_dir, download)
    stubs = {
        "rlinf": types.ModuleType("rlinf"),
        "rlinf.data": types.ModuleType("rlinf.data"),
        "rlinf.data.embodied_io_struct": types.ModuleType("rlinf.data.embodied_io_struct"),
        "rlinf.utils": types.ModuleType("rlinf.utils"),
        "rlinf.utils.logging": types.ModuleType("rlinf.utils.logging"),
    }
    stubs["rlinf.data.embodied_io_struct"].Trajectory = RLINF_TRAJECTORY  # type: ignore[attr-defined]
    stubs["rlinf.utils.logging"].get_logger = lambda: logging.getLogger("rlinf")  # type: ignore[attr-defined]
    logging.getLogger("rlinf").setLevel(logging.ERROR)
    with stubbed(stubs):
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
