"""Run ObjectRL 0.2.1's own trainer twice per algorithm: with its buffer, and with ours injected.

A maintainer script (not part of CI; its pure helpers are tested in ``tests/test_objectrl_harness.py``).
For each algorithm it runs ``python -m objectrl.main --model.name ALGO --env.name ENV ...`` (short
settings, CPU) in a separate virtualenv, once with upstream's
``objectrl.replay_buffers.experience_memory.ReplayBuffer`` and once with ``objectrl_buffer.ReplayBuffer``
put in its place by monkeypatching (every loaded module that holds the name gets ours, then
``objectrl.main`` runs as ``__main__`` through ``runpy``). Both buffers are wrapped by the same timing
subclass, so the report gives, per run: finished or the exception (with its traceback), the returns
ObjectRL logged (training episodes and evaluations), the wall time, the buffer's share of it and the
median ``add`` / ``get_next_batch`` cost. A second run with our buffer and the same ``--system.seed``
checks "same seed, same run" (identical returns, yes/no). The markdown report goes to stdout (and
``--out FILE``).

Run it (any Python >= 3.10 with only the standard library; the project's venv is fine)::

    python benchmarks/objectrl_harness.py                       # dqn/cartpole, sac, td3, ppo (cheetah)
    python benchmarks/objectrl_harness.py --algos dqn sac --out runs/objectrl_harness.md
    python benchmarks/objectrl_harness.py --setup-only           # build (or check) the ObjectRL venv

What it needs:

- A Python 3.12 interpreter (``--python``; found as ``python3.12`` on PATH or under ``~/.pyenv``).
  ObjectRL 0.2.1 declares ``Requires-Python ==3.12.*`` and really needs it: on 3.11, importing
  ``objectrl.main`` fails with ``SyntaxError`` (``class Ensemble[T: nn.Module]`` in
  ``models/basic/ensemble.py``, PEP 695, and a PEP 701 f-string in ``config/utils.py``).
- Network access to PyPI the first time: the venv (default ``~/.cache/objectrl_buffer/objectrl-venv``,
  ``--venv``) gets ``torch==2.13.0`` from PyPI, which for Python 3.12 is the CUDA build with its
  ``nvidia-*`` and ``triton`` wheels (the only CPU torch wheel on this machine is for 3.11). Measured
  here: the venv takes 5.3 GB (torch 1.2 GB, nvidia 2.7 GB, triton 0.7 GB) and took 4.6 minutes to
  build (1.4 GB of the nvidia wheels came from a local mirror); later runs reuse it (a check of ~30 s).
  It also gets torchrl/tensordict, gymnasium with MuJoCo, dm-control (imported at start-up by ObjectRL's
  ``make_env``) and ObjectRL's other imported dependencies; ObjectRL itself is installed from its wheel
  with ``--no-deps`` (seaborn, PyQt6 and metaworld are never imported for these environments). Nothing
  of ObjectRL is vendored: the wheel is downloaded at set-up time into ``<venv>/../wheels``.
- Our package is taken from this checkout through ``PYTHONPATH`` (``--repo`` to point elsewhere).

Runs use ``--system.device cpu --system.storing_device cpu`` and one torch thread (``--threads``); the
logs of every run stay in the work folder (``--workdir``, default a new temp folder) for inspection.
ObjectRL 0.2.1's DQN does not run as published (its ``select_action`` returns a bare tensor that the
trainer indexes with ``["action"]``: ``IndexError`` at the step-0 evaluation, whatever the buffer), so
both DQN runs get a one-line shim (``wrap_bare_action``; ``--no-dqn-shim`` to see the failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

OBJECTRL_VERSION = "0.2.1"
UPSTREAM_MODULE = "objectrl.replay_buffers.experience_memory"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path.home() / ".cache" / "objectrl_buffer" / "objectrl-venv"
CPU_CONSTRAINTS = REPO_ROOT / ".ci" / "constraints-cpu.txt"

#: What ObjectRL 0.2.1 imports when training on gymnasium/MuJoCo envs (its metadata also lists seaborn,
#: PyQt6 and metaworld, never imported on these paths). Pinned to the versions the project tests with.
OBJECTRL_DEPS = (
    "torch==2.13.0",
    "torchrl==0.14.1",
    "tensordict==0.14.3",
    "gymnasium[mujoco]>=1.1.1",
    "dm-control",
    "tqdm",
    "tyro",
    "matplotlib",
    "pandas",
    "tabulate",
    "pyyaml",
)

#: The buffer methods that are timed (public API plus construction and ``len``). A call made from inside
#: another timed call (upstream's ``get_next_batch`` calls ``sample_batch``) counts only in the outer one.
TIMED_METHODS = (
    "__init__",
    "__len__",
    "add",
    "add_batch",
    "sample_batch",
    "sample_random",
    "sample_by_index",
    "sample_by_index_fields",
    "sample_all",
    "reset",
    "create_epoch_iterator",
    "calculate_num_batches",
    "get_steps_and_iterator",
    "get_next_batch",
    "save",
    "load",
)

BUFFERS = ("upstream", "ours")


@dataclasses.dataclass(frozen=True)
class AlgoSpec:
    """One ObjectRL training job: model, environment, steps and algorithm-specific flags."""

    name: str
    env: str
    max_steps: int
    flags: tuple[str, ...] = ()


ALGOS: dict[str, AlgoSpec] = {
    # Warm-up of 1000 random steps, then 2000 steps of learning (DQN switches to policy actions at 1000).
    "dqn": AlgoSpec("dqn", "cartpole", 3000, ("--training.warmup_steps", "1000")),
    "sac": AlgoSpec("sac", "cheetah", 3000, ("--training.warmup_steps", "1000")),
    "td3": AlgoSpec("td3", "cheetah", 3000, ("--training.warmup_steps", "1000")),
    # PPO: no warm-up (asserted by ObjectRL), rollouts of 2048 steps, 10 epochs of batches of 64.
    "ppo": AlgoSpec(
        "ppo",
        "cheetah",
        5000,
        (
            "--training.warmup_steps", "0",
            "--training.learn_frequency", "2048",
            "--training.n_epochs", "10",
            "--training.batch_size", "64",
        ),
    ),
}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Pure helpers (tested without ObjectRL)
# --------------------------------------------------------------------------------------------------


def objectrl_args(
    spec: AlgoSpec, seed: int, result_path: Path, *, steps: int | None = None, eval_episodes: int = 5
) -> list[str]:
    """ObjectRL's command line for ``spec``: CPU, one evaluation at step 0 and one at the end.

    Flags (from ObjectRL's ``config/config.py``): ``--system.seed``, ``--training.max_steps``,
    ``--training.eval_frequency``, ``--training.eval_episodes``, ``--logging.save_frequency`` (plots and
    a checkpoint every N steps; set to the run length) and ``--logging.result_path`` (where ``log.log`` goes).
    """
    n = spec.max_steps if steps is None else steps
    return [
        "--model.name", spec.name,
        "--env.name", spec.env,
        "--system.device", "cpu",
        "--system.storing_device", "cpu",
        "--system.seed", str(seed),
        "--training.max_steps", str(n),
        "--training.eval_frequency", str(n),
        "--training.eval_episodes", str(eval_episodes),
        "--logging.save_frequency", str(n),
        "--logging.result_path", str(result_path),
        *spec.flags,
    ]  # fmt: skip


_EPISODE = re.compile(r"Episode:\s*(\d+)\s+N-steps:\s*(\d+)\s+Reward:\s*(\S+)")
_EVAL = re.compile(r"EVALUATION\s+N-steps:\s*(\d+)\s+Mean_Reward:\s*(\S+)\s+IQM_Reward:\s*(\S+)")
_TRAINING_TIME = re.compile(r"Training time:\s*(\S+) seconds")


@dataclasses.dataclass
class LogSummary:
    """What ObjectRL's ``log.log`` says about a run."""

    episode_returns: list[float] = dataclasses.field(default_factory=list)
    episode_end_steps: list[int] = dataclasses.field(default_factory=list)
    evals: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (step, mean return)
    training_time_s: float | None = None

    def last_mean(self, n: int = 10) -> float | None:
        """Mean return of the last ``n`` training episodes."""
        tail = self.episode_returns[-n:]
        return sum(tail) / len(tail) if tail else None

    @property
    def final_eval(self) -> float | None:
        return self.evals[-1][1] if self.evals else None


def parse_objectrl_log(text: str) -> LogSummary:
    """Parse ObjectRL's logger output (``Episode: ... Reward:``, ``EVALUATION ... Mean_Reward:``)."""
    out = LogSummary()
    for line in text.splitlines():
        if m := _EPISODE.search(line):
            out.episode_end_steps.append(int(m.group(2)))
            out.episode_returns.append(float(m.group(3)))
        elif m := _EVAL.search(line):
            out.evals.append((int(m.group(1)), float(m.group(2))))
        elif m := _TRAINING_TIME.search(line):
            out.training_time_s = float(m.group(1))
    return out


def patch_name(modules: Mapping[str, ModuleType | None], name: str, original: object, replacement: object) -> list[str]:
    """Set ``module.name = replacement`` in every module whose ``name`` is ``original``.

    ``from objectrl.replay_buffers.experience_memory import ReplayBuffer`` copies the class into the
    importing module, so patching only the defining module would miss modules already imported. Reads
    ``vars(module)`` (never ``getattr``, which could run a lazy module ``__getattr__``). Returns the
    sorted names of the patched modules.
    """
    patched = []
    for mod_name, module in list(modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(name) is original:
            setattr(module, name, replacement)
            patched.append(mod_name)
    return sorted(patched)


def make_timed_class(base: type, calls: dict[str, list[int]], clock: Callable[[], int] = time.perf_counter_ns) -> type:
    """A subclass of ``base`` whose ``TIMED_METHODS`` append their duration (ns) to ``calls[name]``.

    Only outermost calls are timed: a timed method called from inside another (``get_next_batch`` ->
    ``sample_batch``) counts in the outer one only, so the durations add up to the time spent in the buffer.
    """
    depth = [0]

    def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        durations = calls.setdefault(name, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return method(*args, **kwargs)
            depth[0] = 1
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                durations.append(clock() - start)
                depth[0] = 0

        timed.__name__ = name
        timed.__qualname__ = f"{base.__name__}.{name}"
        timed.__doc__ = method.__doc__
        return timed

    namespace: dict[str, Any] = {"__module__": base.__module__, "__doc__": base.__doc__}
    for name in TIMED_METHODS:
        method = getattr(base, name, None)
        if callable(method):
            namespace[name] = wrap(name, method)
    return type(base.__name__, (base,), namespace)


def wrap_bare_action(select_action: Callable[..., Any], bare_type: type) -> Callable[..., Any]:
    """``select_action`` returning ``{"action": out}`` where the original returns a bare ``bare_type``.

    ObjectRL 0.2.1's ``DQN.select_action`` returns the action tensor itself, while its trainer reads
    ``agent.select_action(state)["action"]``: indexing a tensor with a str raises ``IndexError: too many
    indices for tensor of dimension 1`` at the step-0 evaluation, whatever the buffer. The harness applies
    this shim to DQN in both runs (upstream's buffer and ours) so that the buffer is exercised at all.
    """

    def select_action_dict(*args: Any, **kwargs: Any) -> Any:
        out = select_action(*args, **kwargs)
        return {"action": out} if isinstance(out, bare_type) else out

    select_action_dict.__name__ = getattr(select_action, "__name__", "select_action")
    select_action_dict.__doc__ = select_action.__doc__
    return select_action_dict


def summarize_calls(calls: Mapping[str, Sequence[int]]) -> dict[str, dict[str, float]]:
    """Per method: number of calls, total seconds, median and 90th percentile in microseconds."""
    out = {}
    for name, durations in calls.items():
        if not durations:
            continue
        ordered = sorted(durations)
        out[name] = {
            "count": len(ordered),
            "total_s": sum(ordered) / 1e9,
            "median_us": statistics.median(ordered) / 1e3,
            "p90_us": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] / 1e3,
        }
    return out


@dataclasses.dataclass
class RunResult:
    """One ObjectRL run as the report shows it."""

    algo: str
    env: str
    buffer: str
    seed: int
    status: str  # "finished", "failed", "timeout" or "no result"
    error: str = ""
    traceback: str = ""
    wall_s: float = 0.0  # the whole child process, interpreter start to exit
    run_s: float = 0.0  # objectrl.main as __main__ (config, env, agent, training, evaluations)
    calls: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    log: LogSummary = dataclasses.field(default_factory=LogSummary)
    patched: list[str] = dataclasses.field(default_factory=list)
    shims: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    run_dir: str = ""

    @property
    def buffer_s(self) -> float:
        return sum(c["total_s"] for c in self.calls.values())

    @property
    def share(self) -> float | None:
        return self.buffer_s / self.run_s if self.run_s > 0 else None

    def median_us(self, method: str) -> float | None:
        c = self.calls.get(method)
        return c["median_us"] if c else None


def _fmt(value: float | None, spec: str = ".1f", empty: str = "") -> str:
    return empty if value is None else format(value, spec)


def format_table(results: Iterable[RunResult]) -> str:
    """The main markdown table: one row per run."""
    head = (
        "| algo | env | buffer | status | episodes | return, last 10 episodes | final eval return "
        "| wall s | run s | buffer s | buffer share | add median µs | get_next_batch median µs |"
    )
    rows = [head, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        status = r.status if not r.error else f"{r.status}: {r.error.splitlines()[0][:120]}"
        share = r.share
        rows.append(
            f"| {r.algo} | {r.env} | {r.buffer} | {status.replace('|', '/')} | {len(r.log.episode_returns)} "
            f"| {_fmt(r.log.last_mean())} | {_fmt(r.log.final_eval)} | {r.wall_s:.1f} | {r.run_s:.1f} "
            f"| {r.buffer_s:.2f} | {_fmt(None if share is None else 100 * share, '.1f')}% "
            f"| {_fmt(r.median_us('add'))} | {_fmt(r.median_us('get_next_batch'))} |"
        )
    return "\n".join(rows)


def format_calls_table(results: Iterable[RunResult]) -> str:
    """Every timed buffer method of every run: calls, total, median and p90."""
    rows = ["| algo | buffer | method | calls | total ms | median µs | p90 µs |", "|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        for name in TIMED_METHODS:
            c = r.calls.get(name)
            if c:
                rows.append(
                    f"| {r.algo} | {r.buffer} | `{name}` | {int(c['count'])} | {1e3 * c['total_s']:.1f} "
                    f"| {c['median_us']:.1f} | {c['p90_us']:.1f} |"
                )
    return "\n".join(rows)


def compare_runs(a: RunResult, b: RunResult) -> tuple[str, str]:
    """("yes"/"no"/"n/a", detail): do two same-seed runs log identical returns?"""
    if a.status != "finished" or b.status != "finished":
        return "n/a", f"a run did not finish ({a.status} / {b.status})"
    ra, rb = a.log.episode_returns, b.log.episode_returns
    if not ra and not a.log.evals:
        return "n/a", "no returns logged"
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        if x != y:
            return "no", f"episode {i + 1} (ends at step {a.log.episode_end_steps[i]}): {x} vs {y}"
    if len(ra) != len(rb):
        return "no", f"{len(ra)} vs {len(rb)} episodes"
    if a.log.evals != b.log.evals:
        return "no", f"evaluations differ: {a.log.evals} vs {b.log.evals}"
    return "yes", f"{len(ra)} episodes and {len(a.log.evals)} evaluations identical"


def format_same_seed(pairs: Iterable[tuple[RunResult, RunResult]]) -> str:
    rows = ["| algo | buffer | seed | identical returns | detail |", "|---|---|---:|---|---|"]
    for a, b in pairs:
        verdict, detail = compare_runs(a, b)
        rows.append(f"| {a.algo} | {a.buffer} | {a.seed} | {verdict} | {detail.replace('|', '/')} |")
    return "\n".join(rows)


def format_failures(results: Iterable[RunResult], tail_lines: int = 40) -> str:
    parts = []
    for r in results:
        if r.status == "finished":
            continue
        tb = "\n".join(r.traceback.rstrip().splitlines()[-tail_lines:]) or "(no traceback)"
        made = ", ".join(f"{name} x{int(c['count'])}" for name, c in r.calls.items()) or "none"
        last = r.log.episode_end_steps[-1] if r.log.episode_end_steps else "-"
        parts.append(
            f"### {r.algo} / {r.buffer}: {r.status}\n\n{r.error}\n\n"
            f"Buffer calls up to then (the failing one included): {made}; the last episode logged ended at step {last}."
            f"\n\n```\n{tb}\n```\n\nLogs: `{r.run_dir}`"
        )
    return "\n\n".join(parts) if parts else "None."


def format_report(
    results: Sequence[RunResult], pairs: Sequence[tuple[RunResult, RunResult]], header: Sequence[str]
) -> str:
    warned = [f"- {r.algo} / {r.buffer}: `{w}`" for r in results for w in r.warnings]
    sections = [
        "# ObjectRL 0.2.1 trainer: upstream buffer vs objectrl_buffer",
        "\n".join(header),
        "## Runs\n\n" + format_table(results),
        "## Same seed, same run\n\n" + (format_same_seed(pairs) if pairs else "Not run."),
        "## Failures\n\n" + format_failures(results),
        "## Warnings printed by the runs\n\n" + ("\n".join(warned) if warned else "None."),
        "## Buffer calls\n\n" + format_calls_table(results),
    ]
    return "\n\n".join(sections) + "\n"


def warning_lines(stderr: str, limit: int = 10) -> list[str]:
    """Distinct ``...Warning: message`` lines of a run's stderr (first ``limit``)."""
    seen: list[str] = []
    for line in stderr.splitlines():
        line = line.strip()
        if re.search(r"\w+Warning: ", line) and line not in seen:
            seen.append(line[:300])
            if len(seen) >= limit:
                break
    return seen


# --------------------------------------------------------------------------------------------------
# Child side: runs inside the ObjectRL venv (`python objectrl_harness.py --launch ...`)
# --------------------------------------------------------------------------------------------------


def launch(result_json: str, buffer: str, threads: int, objectrl_argv: list[str], *, no_shim: bool = False) -> int:
    """Inject the (timed) buffer, run ``objectrl.main`` as ``__main__``, write what happened as JSON."""
    import runpy
    import traceback

    wall_start = time.perf_counter()
    import torch

    torch.set_num_threads(threads)
    import objectrl.replay_buffers.experience_memory as experience_memory

    upstream = experience_memory.ReplayBuffer
    if buffer == "ours":
        from objectrl_buffer import ReplayBuffer as base
    else:
        base = upstream
    calls: dict[str, list[int]] = {}
    timed = make_timed_class(base, calls)
    # Import the modules that take the name (agents/base_agent.py) and the trainer first, then patch
    # every module that holds upstream's class; the defining module is patched too, so a later
    # `from ... import ReplayBuffer` also gets ours.
    import objectrl.agents.base_agent
    import objectrl.config.config
    import objectrl.experiments.control_experiment  # noqa: F401

    patched = patch_name(sys.modules, "ReplayBuffer", upstream, timed)
    shims = []
    if not no_shim:
        import objectrl.models.dqn as dqn

        dqn.DQN.select_action = wrap_bare_action(dqn.DQN.select_action, torch.Tensor)  # type: ignore[method-assign]
        shims.append("objectrl.models.dqn.DQN.select_action: bare tensor -> {'action': tensor}")
    record: dict[str, Any] = {
        "status": "finished",
        "error": "",
        "traceback": "",
        "patched": patched,
        "shims": shims,
        "buffer_class": f"{base.__module__}.{base.__qualname__}",
    }
    sys.argv = ["objectrl.main", *objectrl_argv]
    run_start = time.perf_counter()
    try:
        runpy.run_module("objectrl.main", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            record.update(status="failed", error=f"SystemExit: {exc.code}", traceback=traceback.format_exc())
    except BaseException as exc:  # report KeyboardInterrupt too, then stop
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    finally:
        end = time.perf_counter()
        record.update(run_s=end - run_start, child_wall_s=end - wall_start, calls=summarize_calls(calls))
        Path(result_json).write_text(json.dumps(record, indent=1))
    return 0 if record["status"] == "finished" else 1


# --------------------------------------------------------------------------------------------------
# Parent side: the virtualenv and the runs
# --------------------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def find_python312() -> str | None:
    """A Python 3.12 interpreter: ``python3.12`` on PATH, else the newest ``~/.pyenv/versions/3.12.*``."""
    found = shutil.which("python3.12")
    if found:
        return found
    candidates = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python"))
    return str(candidates[-1]) if candidates else None


def _run(cmd: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], text=True, check=False, **kwargs)


def venv_versions(py: Path) -> dict[str, str] | None:
    """Versions in the venv if ObjectRL, torch, torchrl, tensordict, gymnasium and MuJoCo all import."""
    probe = (
        "import json, platform, importlib.metadata as m\n"
        "import torch, torchrl, tensordict, gymnasium, mujoco, dm_control, objectrl\n"
        "names = ['objectrl', 'torch', 'torchrl', 'tensordict', 'gymnasium', 'mujoco', 'numpy']\n"
        "d = {n: m.version(n) for n in names}\n"
        "d['python'] = platform.python_version()\n"
        "print(json.dumps(d))\n"
    )
    if not py.exists():
        return None
    proc = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    versions: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return versions if versions.get("objectrl") == OBJECTRL_VERSION else None


def objectrl_help_error(py: Path) -> str | None:
    """None if ``python -m objectrl.main --help`` works in the venv, else the tail of its error."""
    proc = subprocess.run(
        [str(py), "-m", "objectrl.main", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    if proc.returncode == 0:
        return None
    return "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])


def ensure_venv(venv: Path, python: str | None, wheel_dir: Path) -> dict[str, str]:
    """Reuse ``venv`` if ObjectRL 0.2.1 runs there, else build it with ``python`` (3.12). Returns versions."""
    py = venv_python(venv)
    versions = venv_versions(py)
    if versions is None:
        if python is None:
            sys.exit("no Python 3.12 found: pass --python /path/to/python3.12 (ObjectRL 0.2.1 needs 3.12)")
        started = time.perf_counter()
        if not py.exists():
            _run([python, "-m", "venv", venv]).check_returncode()
        minor = subprocess.run(
            [str(py), "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True, check=True
        ).stdout.strip()
        pip = [py, "-m", "pip", "install", "-q"]
        # The local CPU torch wheel is for 3.11 only; there the constraints keep pip off the CUDA build.
        constraints = ["-c", CPU_CONSTRAINTS] if minor == "11" and CPU_CONSTRAINTS.exists() else []
        _run([*pip, *constraints, *OBJECTRL_DEPS]).check_returncode()
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheels = sorted(wheel_dir.glob(f"objectrl-{OBJECTRL_VERSION}-*.whl"))
        if not wheels:
            _run(
                [
                    py,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--python-version",
                    "3.12",
                    "--only-binary=:all:",
                    f"objectrl=={OBJECTRL_VERSION}",
                    "-d",
                    wheel_dir,
                    "-q",
                ]
            ).check_returncode()
            wheels = sorted(wheel_dir.glob(f"objectrl-{OBJECTRL_VERSION}-*.whl"))
        extra = ["--ignore-requires-python"] if minor != "12" else []
        _run([*pip, "--no-deps", *extra, wheels[-1]]).check_returncode()
        print(f"venv built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        versions = venv_versions(py)
        if versions is None:
            sys.exit(f"the venv at {venv} was built but ObjectRL or its dependencies do not import")
    error = objectrl_help_error(py)
    if error is not None:
        sys.exit(f"`python -m objectrl.main --help` fails in {venv} (Python {versions['python']}):\n{error}")
    return versions


def run_once(
    py: Path,
    spec: AlgoSpec,
    buffer: str,
    seed: int,
    run_dir: Path,
    *,
    repo: Path,
    steps: int | None,
    eval_episodes: int,
    threads: int,
    timeout: float,
    shim: bool = True,
) -> RunResult:
    """One ObjectRL training run in a child process; logs, stdout and stderr stay in ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result_json = run_dir / "result.json"
    args = objectrl_args(spec, seed, run_dir / "logs", steps=steps, eval_episodes=eval_episodes)
    shim_arg = "shim" if shim and spec.name == "dqn" else "no-shim"  # only DQN's select_action needs it
    cmd = [str(py), str(Path(__file__).resolve()), "--launch", str(result_json), buffer, str(threads), shim_arg, "--"]
    cmd += args
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    print(f"[{spec.name}/{buffer} seed {seed}] running ... (logs in {run_dir})", file=sys.stderr, flush=True)
    result = RunResult(spec.name, spec.env, buffer, seed, "no result", run_dir=str(run_dir))
    start = time.perf_counter()
    with open(run_dir / "stdout.txt", "w") as out, open(run_dir / "stderr.txt", "w") as err:
        try:
            subprocess.run(cmd, stdout=out, stderr=err, env=env, cwd=run_dir, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            result.status, result.error = "timeout", f"killed after {timeout:.0f} s"
    result.wall_s = time.perf_counter() - start
    stderr = (run_dir / "stderr.txt").read_text(errors="replace")
    result.warnings = warning_lines(stderr)
    if result_json.exists():
        record = json.loads(result_json.read_text())
        result.status, result.error, result.traceback = record["status"], record["error"], record["traceback"]
        result.run_s, result.calls, result.patched = record["run_s"], record["calls"], record["patched"]
        result.shims = record["shims"]
    elif result.status != "timeout":
        result.error = "the child wrote no result"
        result.traceback = "\n".join(stderr.splitlines()[-40:])
    logs = sorted((run_dir / "logs").rglob("log.log"))
    if logs:
        result.log = parse_objectrl_log(logs[-1].read_text(errors="replace"))
    print(
        f"[{spec.name}/{buffer} seed {seed}] {result.status} {result.error[:200]} ({result.wall_s:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return result


def repo_description(repo: Path) -> str:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--launch"]:  # child mode, inside the ObjectRL venv
        sep = argv.index("--")
        result_json, buffer, threads, shim = argv[1:sep]
        return launch(result_json, buffer, int(threads), argv[sep + 1 :], no_shim=shim == "no-shim")

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--buffers", nargs="+", default=list(BUFFERS), choices=BUFFERS)
    parser.add_argument(
        "--same-seed",
        nargs="*",
        default=["ours"],
        choices=BUFFERS,
        help="buffers whose run is repeated with the same seed (default: ours; none: skip)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="override every algorithm's max_steps")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each run (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--python", default=None, help="interpreter to build the venv with (3.12)")
    parser.add_argument("--wheel-dir", type=Path, default=None, help="where the ObjectRL wheel is downloaded")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="checkout whose objectrl_buffer is injected")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the runs' logs (default: temp)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument(
        "--no-dqn-shim",
        action="store_true",
        help="run DQN as published (its select_action returns a bare tensor: IndexError at the step-0 evaluation)",
    )
    opts = parser.parse_args(argv)

    wheel_dir = opts.wheel_dir or opts.venv.parent / "wheels"
    setup_start = time.perf_counter()
    versions = ensure_venv(opts.venv, opts.python or find_python312(), wheel_dir)
    setup_s = time.perf_counter() - setup_start
    print(f"ObjectRL venv ready: {opts.venv} {versions} ({setup_s:.0f} s)", file=sys.stderr)
    if opts.setup_only:
        return 0

    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="objectrl_harness-"))
    py = venv_python(opts.venv)
    results: list[RunResult] = []
    pairs: list[tuple[RunResult, RunResult]] = []
    for algo in opts.algos:
        spec = ALGOS[algo]
        for buffer in opts.buffers:
            runs = []
            for tag in ("a", "b") if buffer in opts.same_seed else ("a",):
                runs.append(
                    run_once(
                        py,
                        spec,
                        buffer,
                        opts.seed,
                        workdir / f"{algo}-{buffer}-{tag}",
                        repo=opts.repo,
                        steps=opts.steps,
                        eval_episodes=opts.eval_episodes,
                        threads=opts.threads,
                        timeout=opts.timeout,
                        shim=not opts.no_dqn_shim,
                    )
                )
            results.append(runs[0])
            if len(runs) == 2:
                pairs.append((runs[0], runs[1]))

    header = [
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; "
        f"runs one at a time, {opts.threads} torch thread(s), CPU  ",
        "ObjectRL venv: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "  ",
        f"objectrl_buffer: {opts.repo} at {repo_description(opts.repo)}  ",
        f"Command: `python benchmarks/objectrl_harness.py {' '.join(argv)}`  ",
        f"Runs: seed {opts.seed}, {opts.eval_episodes} evaluation episodes at step 0 and at the end; steps: "
        + ", ".join(f"{a} {opts.steps or ALGOS[a].max_steps} on {ALGOS[a].env}" for a in opts.algos)
        + f"; logs in `{workdir}`.  ",
        "Shims (both buffers): "
        + ("; ".join(sorted({s for r in results for s in r.shims})) or "none")
        + " (ObjectRL 0.2.1's DQN cannot run without it, see `wrap_bare_action`; other models run unshimmed).  ",
        "wall s: the child process; run s: `objectrl.main` itself (imports excluded); buffer s: outermost calls of "
        "the buffer's public methods (construction included); share = buffer s / run s.",
    ]
    report = format_report(results, pairs, header)
    print(report)
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
