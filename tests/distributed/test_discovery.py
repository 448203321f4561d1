"""A named RemoteBuffer reached from another driver (issue 23, "Discovery"): ``launch(name=, namespace=,
detached=)`` and ``RemoteBuffer.connect(name, namespace=)``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import InvalidArgumentError
from tests.support import rows

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """A local Ray of this module's own (another driver connects to it by its address)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="tests")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def driver(address: str, code: str) -> str:
    """Run ``code`` in a second driver connected to ``address``; its stdout."""
    script = f"import ray\nray.init(address={address!r}, log_to_driver=False)\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_another_driver_connects_by_name_and_namespace_writes_and_samples(address: str) -> None:
    remote = RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", 1000, num_shards=2, seed=0, name="replay", namespace="team"
    )
    try:
        remote.add_batch(rows(0, 5))  # one batch a shard
        remote.add_batch(rows(5, 5))
        out = driver(
            address,
            """
            from objectrl_buffer.distributed import RemoteBuffer
            from tests.support import rows
            other = RemoteBuffer.connect("replay", namespace="team")
            other.add_batch(rows(10, 30))
            print(len(other), other.sample_batch(8)["step"].shape[0])
            """,
        )
        assert out.split() == ["40", "8"]
        assert len(remote) == 40  # the launcher sees the other driver's rows
        assert sorted(int(s) // 1000 for part in remote.call("sample_all") for s in part["step"].reshape(-1)) == list(
            range(40)
        )
        with pytest.raises(InvalidArgumentError, match="'replay' is in use in namespace 'team'"):
            RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 10, name="replay", namespace="team")
        assert len(RemoteBuffer.connect("replay", namespace="team")) == 40
    finally:
        remote.kill()
    with pytest.raises(InvalidArgumentError, match="no remote buffer named 'replay' in namespace 'team'"):
        RemoteBuffer.connect("replay", namespace="team")


def test_bad_names_are_refused_before_anything_starts(address: str) -> None:
    with pytest.raises(InvalidArgumentError, match="actor_options must not set \\['name'\\]"):
        RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 10, num_shards=2, actor_options={"name": "x"})
    with pytest.raises(InvalidArgumentError, match="namespace= needs a name="):
        RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 10, namespace="team")
    with pytest.raises(InvalidArgumentError, match="without '/'"):
        RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 10, name="a/b")


def test_a_detached_buffer_outlives_the_driver_that_launched_it(address: str) -> None:
    driver(
        address,
        """
        from objectrl_buffer import ReplayBuffer
        from objectrl_buffer.distributed import RemoteBuffer
        from tests.support import rows
        remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 100, num_shards=2, name="kept", namespace="team",
                                     detached=True)
        remote.add_batch(rows(0, 5))
        """,
    )
    remote = RemoteBuffer.connect("kept", namespace="team")
    assert len(remote) == 5
    remote.kill()
    with pytest.raises(InvalidArgumentError, match="no remote buffer named 'kept'"):
        RemoteBuffer.connect("kept", namespace="team")
