"""The install (issue 17): which torch `make` installs (.ci/torch_index.py, simulated with a local index on
127.0.0.1, never the internet), the Makefile's commands, the editable mode type checkers see, LICENSE."""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

SCRIPT = REPO / ".ci" / "torch_index.py"
PYPI_ONLY = "-c .ci/constraints-cpu.txt"


def torch_args(setting: str | None, cpu_index: str) -> tuple[str, str]:
    """What the script prints (stdout, stderr) for ``TORCH_INDEX=setting`` (``None``: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX"}
    env["TORCH_CPU_INDEX"] = cpu_index
    if setting is not None:
        env["TORCH_INDEX"] = setting
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip(), done.stderr.strip()


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index with a torch page, served on 127.0.0.1: PyTorch's CPU index as the probe sees it."""
    (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)
    (tmp_path / "whl" / "cpu" / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu-cp311-linux_x86_64.whl</a>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dead_index() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def test_the_cpu_index_is_used_when_it_is_reachable(local_index: str) -> None:
    for setting in (None, "auto"):  # the Makefile's default
        out, err = torch_args(setting, local_index)
        assert out == f"{PYPI_ONLY} --index-url {local_index}"
        assert f"the CPU build of torch from {local_index}" in err


def test_the_plain_pin_is_used_when_the_cpu_index_is_unreachable(dead_index: str) -> None:
    out, err = torch_args("auto", dead_index)
    assert out == PYPI_ONLY
    assert "not reachable" in err and "CUDA build" in err


def test_an_index_with_no_torch_page_counts_as_unreachable(local_index: str) -> None:
    out, _ = torch_args("auto", local_index.replace("/whl/cpu", "/nothing"))
    assert out == PYPI_ONLY


def test_torch_index_empty_forces_the_plain_pin_without_probing(local_index: str) -> None:
    out, err = torch_args("", local_index)
    assert out == PYPI_ONLY and "TORCH_INDEX is empty" in err


def test_torch_index_a_url_is_used_as_given(dead_index: str) -> None:
    cuda = "https://download.pytorch.org/whl/cu126"
    out, _ = torch_args(cuda, dead_index)  # not probed: naming it is the user's choice
    assert out == f"{PYPI_ONLY} --index-url {cuda}"


def make_dry_run(*assignments: str) -> list[str]:
    """The commands ``make setup`` would run for a fresh venv (``make -n``: nothing is run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env.pop("TORCH_INDEX", None)
    done = subprocess.run(
        ["make", "-n", "-B", "setup", "VENV=/nonexistent/venv", *assignments],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.replace("\\\n", " ").splitlines()  # one line per command


@pytest.mark.skipif(not os.path.exists("/usr/bin/make"), reason="needs make")
def test_the_makefile_installs_torch_through_the_script_visibly_and_the_package_in_compat_mode() -> None:
    lines = make_dry_run()
    torch_step = next(line for line in lines if "torch_index.py" in line)
    assert "TORCH_INDEX='auto'" in torch_step and "$args torch" in torch_step
    assert " -q" not in torch_step  # pip shows what it downloads
    editable = next(line for line in lines if " -e " in line)
    assert "--config-settings editable_mode=compat" in editable
    assert "TORCH_INDEX=''" in next(line for line in make_dry_run("TORCH_INDEX=") if "torch_index.py" in line)


def test_ci_forces_the_plain_pin() -> None:
    assert re.search(r"^TORCH_INDEX= make test$", (REPO / ".ci" / "run").read_text(), re.M)


# ---------------------------------------------------------------- the editable install, as a user's mypy sees it
USER_CODE = """\
from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer

rb = ReplayBuffer("cpu", "cpu", 10)
reveal_type(rb)
reveal_type(PrioritizedReplayBuffer.sample)
rb.sample_batch("4")
"""


def editable_install(tmp_path: Path, mode: str | None) -> Path:
    """A fresh venv holding this checkout as the Makefile installs it (``mode``), the other packages of the
    test's own environment linked in (never installed, never changed); return its python."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    deps = tmp_path / "deps"  # everything but this package's own install and .pth hooks
    deps.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(("objectrl_buffer", "__editable__", "_objectrl")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    target_site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (target_site / "deps.pth").write_text(f"{deps}\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
    install += ["--no-build-isolation", "-e", str(REPO)]
    install += [] if mode is None else ["--config-settings", f"editable_mode={mode}"]
    subprocess.run(install, check=True, timeout=300, capture_output=True, cwd=tmp_path)
    return python


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RUN_SLOW") != "1", reason="a fresh venv and a cold mypy run (~30 s): set RUN_SLOW=1"
)
def test_a_users_type_checker_sees_the_packages_types_outside_the_repo(tmp_path: Path) -> None:
    makefile = (REPO / "Makefile").read_text()
    mode = re.search(r"editable_mode=(\w+)", makefile).group(1)  # type: ignore[union-attr]
    python = editable_install(tmp_path, mode)
    user = tmp_path / "user"
    user.mkdir()
    (user / "train.py").write_text(USER_CODE)
    run = subprocess.run(
        [python, "-c", "import objectrl_buffer; print(objectrl_buffer.__file__)"],
        cwd=user,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == str(REPO / "objectrl_buffer" / "__init__.py")
    checked = subprocess.run(
        [python, "-m", "mypy", "--no-incremental", "--follow-imports=silent", "train.py"],
        cwd=user,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = checked.stdout + checked.stderr
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert "import-not-found" not in out and len(revealed) == 2, out
    assert revealed[0] == "objectrl_buffer.replay_buffer.ReplayBuffer"
    assert revealed[1].startswith("def (self: objectrl_buffer.replay_buffer.ReplayBuffer, batch_size: int, *, n_step")
    # (its return shows as Any to mypy: tensordict ships no py.typed; Pylance reads TensorDict from the source)
    assert 'Argument 1 to "sample_batch" of "ReplayBuffer" has incompatible type "str"' in out


# ---------------------------------------------------------------- what the package ships
def test_sampling_methods_are_annotated_to_return_tensordicts() -> None:
    from collections.abc import Iterator
    from typing import get_type_hints

    from tensordict import TensorDict

    from objectrl_buffer import HerReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer

    for cls in (ReplayBuffer, PrioritizedReplayBuffer, HerReplayBuffer):
        for name in (
            "sample_batch",
            "sample",
            "sample_random",
            "sample_by_index",
            "sample_by_index_fields",
            "sample_slices",
            "sample_all",
            "get_next_batch",
        ):
            assert get_type_hints(getattr(cls, name))["return"] is TensorDict, f"{cls.__name__}.{name}"
        assert get_type_hints(cls.create_epoch_iterator)["return"] == Iterator[TensorDict]


def test_the_package_ships_py_typed() -> None:
    import tomllib

    assert (REPO / "objectrl_buffer" / "py.typed").is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["objectrl_buffer"]


def test_the_license_file_matches_pyproject() -> None:
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    text = (REPO / "LICENSE").read_text()
    assert declared == "MIT" and text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} objectrl_buffer contributors$", text, re.M)
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
