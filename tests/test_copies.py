"""``pickle``, ``copy.deepcopy`` and ``torch.save``/``torch.load`` give a full, independent buffer."""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from tests.support import assert_td_equal, fill, objectrl_transition, steps_of


def torch_roundtrip(rb: Any) -> Any:
    stream = io.BytesIO()
    torch.save(rb, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=False)


COPIES: dict[str, Callable[[Any], Any]] = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda rb: pickle.loads(pickle.dumps(rb)),
    "torch.save": torch_roundtrip,
}
# multiprocessing's own pickler (ForkingPickler) shares a buffer with the child instead of copying it:
# tests/distributed/test_process.py


@pytest.fixture(params=list(COPIES))
def copier(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    return COPIES[request.param]


def test_issue_example_copy_keeps_later_adds(copier: Callable[[Any], Any], tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 5, seed=0, storage_dir=tmp_path)
    rb.add({"x": 0.0})
    rb.add({"x": 1.0})
    twin = copier(rb)
    twin.add({"x": 9.0})
    assert twin.sample_all()["x"].tolist() == [0.0, 1.0, 9.0]
    assert rb.sample_all()["x"].tolist() == [0.0, 1.0]
    rb.add({"x": 5.0})
    assert twin.sample_all()["x"].tolist() == [0.0, 1.0, 9.0]
    assert rb.sample_all()["x"].tolist() == [0.0, 1.0, 5.0]
    twin.close()
    rb.close()


@pytest.mark.parametrize("steps", [range(4), range(25)], ids=["partial", "wrapped"])
def test_copy_is_the_same_buffer(copier: Callable[[Any], Any], make_buffer: Any, steps: range) -> None:
    rb = make_buffer(10, shuffle=True)
    fill(rb, steps)
    rb.sample_batch(3)  # move the generator off its seed
    rb.create_epoch_iterator(2)
    twin = copier(rb)
    try:
        assert (twin.buffer_size, twin.data_size, twin.pointer, twin.shuffle) == (10, len(rb), rb.pointer, True)
        assert (twin.device, twin.storing_device, twin.storage_dir) == (rb.device, rb.storing_device, rb.storage_dir)
        assert twin.schema == rb.schema
        assert twin.epoch_iterator is None  # an iterator is not copied: it reads the buffer it came from
        assert twin.storage_folder != rb.storage_folder
        assert_td_equal(twin.sample_all(), rb.sample_all())
        assert_td_equal(twin.sample_by_index(range(len(rb))), rb.sample_by_index(range(len(rb))))
        assert torch.equal(twin.generator.get_state(), rb.generator.get_state())
        assert_td_equal(twin.sample_batch(16, n_step=3), rb.sample_batch(16, n_step=3))
        assert_td_equal(torch.cat(list(twin.create_epoch_iterator(4))), torch.cat(list(rb.create_epoch_iterator(4))))
        twin.add(objectrl_transition(100))
        assert 100 in steps_of(twin.sample_all()) and 100 not in steps_of(rb.sample_all())
    finally:
        twin.close()


def test_copy_of_an_empty_buffer_writes_into_its_own_folder(copier: Callable[[Any], Any], tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path)
    twin = copier(rb)
    twin.add({"x": 1.0})
    rb.add({"x": 2.0})
    assert twin.sample_all()["x"].tolist() == [1.0] and rb.sample_all()["x"].tolist() == [2.0]
    folder = twin.storage_folder
    assert folder is not None and os.path.isdir(folder) and folder != rb.storage_folder
    twin.close()
    assert not os.path.exists(folder)
    again = copier(rb)
    again.add({"x": 3.0})
    folder = again.storage_folder
    assert folder is not None and os.path.isdir(folder)
    del again
    gc.collect()
    assert not os.path.exists(folder)
    rb.close()


@pytest.mark.parametrize("where", ["default", "storage_dir"])
def test_copy_written_and_never_closed_leaves_no_folder_at_exit(tmp_path: Any, where: str) -> None:
    script = textwrap.dedent(
        """
        import pickle, sys
        from objectrl_buffer import ReplayBuffer
        rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=sys.argv[1] or None)
        twin = pickle.loads(pickle.dumps(rb))
        twin.add({"x": 1.0})
        print(twin.storage_folder)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path) if where == "storage_dir" else ""],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    folder = out.stdout.strip()
    assert folder.startswith("/") and not os.path.exists(folder)
    assert os.listdir(tmp_path) == []


def test_prioritized_copy_keeps_priorities(copier: Callable[[Any], Any], tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 16, seed=3, alpha=0.7, beta=0.5, eps=0.01, storage_dir=tmp_path)
    rb.add_batch({"x": torch.arange(20.0)})
    rb.update_priority(torch.arange(16), torch.linspace(0.1, 3.0, 16))
    twin = copier(rb)
    try:
        assert (twin.alpha, twin.beta, twin.eps, twin.max_priority) == (0.7, 0.5, 0.01, rb.max_priority)
        assert torch.equal(twin.priorities(), rb.priorities())
        assert_td_equal(twin.sample_batch(32), rb.sample_batch(32))
        twin.update_priority([0, 1], [50.0, 60.0])
        assert twin.max_priority == 60.0 and rb.max_priority == 3.0
        assert not torch.equal(twin.priorities(), rb.priorities())
        twin.add({"x": 99.0})
        assert float(twin.priorities()[4]) == 60.0 and float(rb.priorities()[4]) != 60.0
    finally:
        twin.close()
        rb.close()


def test_copy_of_a_closed_buffer_is_closed(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path)
    rb.add({"x": 1.0})
    rb.close()
    twin = copy.deepcopy(rb)
    assert len(twin) == 0 and twin.storage_folder is None
    with pytest.raises(RuntimeError):
        twin.add({"x": 2.0})
