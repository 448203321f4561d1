"""A real ``redis-server`` for the tests, started on a free loopback port and stopped after them.

Without the binary the tests that need it skip, unless ``CI`` is set (``.ci/run`` installs Debian's
``redis-server``): then they fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``(process, url)`` of a fresh ``redis-server`` (no persistence) on a free loopback port."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/run installs Debian's redis-server)")
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    for _ in range(5):  # a port taken between the probe and the server's bind: another one
        port = free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--dir", str(folder)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if _answers(port):
                return process, f"redis://127.0.0.1:{port}/0"
            time.sleep(0.02)
        stop_server(process)
    pytest.fail("redis-server did not start on a free loopback port")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a ``redis-server`` running for this test module."""
    process, url = start_server(tmp_path_factory.mktemp("redis"))
    yield url
    stop_server(process)


@pytest.fixture
def key_prefix() -> str:
    """Keys no other test uses (the tests of a module share one server)."""
    return f"test:{uuid.uuid4().hex}:"
