"""AWorld 0.2.6's replay buffer (``aworld/replay_buffer/``), loaded by file path from its wheel on PyPI at run
time, with small stubs for the rest of AWorld. Nothing of AWorld is kept in this repository.

Used by ``tasks_bench.py`` and the differential tests of ``objectrl_buffer.tasks``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

VERSION = "0.2.6"
MODULES = ("query_filter", "base", "storage/multi_proc_mem")
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "objectrl_buffer", "aworld")


class Unavailable(Exception):
    """The wheel could not be found or downloaded."""


def wheel_folder(cache_dir: str = DEFAULT_CACHE, download: bool = True) -> Path:
    """The folder holding the unpacked ``aworld/replay_buffer`` modules of the wheel (downloaded once)."""
    cache = Path(cache_dir)
    target = cache / f"aworld-{VERSION}"
    if all((target / "aworld" / "replay_buffer" / f"{m}.py").exists() for m in MODULES):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"aworld-{VERSION}-*.whl"))
    if not found and download:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += [f"aworld=={VERSION}", "-d", str(cache), "-q"]
        subprocess.run(cmd, check=False, capture_output=True, timeout=300)
        found = sorted(cache.glob(f"aworld-{VERSION}-*.whl"))
    if not found:
        raise Unavailable(f"aworld {VERSION} wheel not available (pip download failed or offline)")
    with zipfile.ZipFile(found[0]) as zf:
        for m in MODULES:
            zf.extract(f"aworld/replay_buffer/{m}.py", target)
    return target


def _stub(name: str, **attrs: Any) -> None:
    module = sys.modules.get(name) or types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []
    sys.modules[name] = module


class _Placeholder:
    """Stands in for AWorld's pydantic ``Observation``/``ActionModel``."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def load(cache_dir: str = DEFAULT_CACHE, download: bool = True) -> dict[str, types.ModuleType]:
    """``{"query_filter", "base", "multi_proc_mem"}`` modules of upstream, registered as ``aworld.*``."""
    if "aworld.replay_buffer.base" in sys.modules and hasattr(sys.modules["aworld.replay_buffer.base"], "DataRow"):
        rb = "aworld.replay_buffer"
        names = ("query_filter", "base", "storage.multi_proc_mem")
        return {n.split(".")[-1]: sys.modules[f"{rb}.{n}"] for n in names}
    folder = wheel_folder(cache_dir, download)
    for pkg in ("aworld", "aworld.core", "aworld.logs", "aworld.runners", "aworld.replay_buffer"):
        _stub(pkg)
    _stub("aworld.replay_buffer.storage")
    _stub("aworld.core.common", ActionModel=_Placeholder, Observation=_Placeholder)
    _stub("aworld.logs.util", logger=logging.getLogger("aworld"))
    _stub("aworld.runners.utils", _to_serializable=lambda x: x)
    import multiprocessing.shared_memory  # noqa: F401  (upstream uses it without importing it)

    out = {}
    for m in MODULES:
        name = "aworld.replay_buffer." + m.replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, folder / "aworld" / "replay_buffer" / f"{m}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        out[m.split("/")[-1]] = module
    return out
