""".ci/run installs the browser the docs tests open pages in (Debian's chromium) when it is missing and it may
(root, or sudo without a password), and runs the README's test command with ``CI`` set, so that the docs tests
fail rather than skip without a browser. Run here against stand-ins for apt-get, sudo, id and make."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_ci(tmp_path: Path, *, uid: int, chromium: bool, sudo: bool, redis: bool = True) -> list[str]:
    """Runs .ci/run with only the stand-ins on PATH; returns the commands they logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    bash = shutil.which("bash")
    assert bash is not None
    stand_ins = {
        "id": f"echo {uid}",
        "apt-get": f'echo "apt-get $*" >> {log}',
        "make": f'echo "make $* CI=$CI TORCH_INDEX=$TORCH_INDEX" >> {log}',
        "dirname": f'{shutil.which("dirname")} "$@"',
    }
    if chromium:
        stand_ins["chromium"] = "true"
    if redis:
        stand_ins["redis-server"] = "true"
    if sudo:
        stand_ins["sudo"] = f'if [ "$1" = -n ]; then shift; fi; echo "sudo $*" >> {log}; {shutil.which("env")} "$@"'
        stand_ins["true"] = "exit 0"
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!{bash}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    subprocess.run([bash, str(REPO / ".ci" / "run")], env=env, check=True, timeout=60)
    return log.read_text().splitlines()


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_ci_installs_chromium_when_missing_then_runs_make_test_with_ci_set(tmp_path: Path) -> None:
    assert run_ci(tmp_path, uid=0, chromium=False, sudo=False) == [
        "apt-get update",
        "apt-get install -y chromium",
        "make test CI=1 TORCH_INDEX=",
    ]


@pytest.mark.skipif(os.name != "posix", reason="bash script")
@pytest.mark.parametrize(
    ("uid", "chromium", "sudo", "installs"),
    [(0, True, False, False), (1000, False, True, True), (1000, False, False, False)],
    ids=["already-installed", "sudo", "no-rights"],
)
def test_ci_installs_chromium_only_when_missing_and_allowed(
    tmp_path: Path, uid: int, chromium: bool, sudo: bool, installs: bool
) -> None:
    logged = run_ci(tmp_path, uid=uid, chromium=chromium, sudo=sudo)
    assert ("apt-get install -y chromium" in logged) == installs
    assert logged[-1] == "make test CI=1 TORCH_INDEX="


@pytest.mark.skipif(os.name != "posix", reason="bash script")
@pytest.mark.parametrize(("uid", "sudo"), [(0, False), (1000, True)], ids=["root", "sudo"])
def test_ci_installs_redis_server_when_missing(tmp_path: Path, uid: int, sudo: bool) -> None:
    logged = run_ci(tmp_path, uid=uid, chromium=True, sudo=sudo, redis=False)
    assert "apt-get install -y redis-server" in logged
    assert "apt-get install -y chromium" not in logged
    assert logged[-1] == "make test CI=1 TORCH_INDEX="
