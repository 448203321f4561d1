"""Compact pixel buffers: the overlap checks refuse wrong data (nothing stored), checkpoints keep the
compact form and load into either form (old plain checkpoints too), and nbytes is about the unique frames."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import CheckpointError, ForkedBufferError, InvalidArgumentError, SchemaError
from tests.compact.streams import env_rows, steps_of
from tests.compact.test_against_plain import assert_same

PIXELS: dict[str, Any] = {"next_of": {"next_state": "state"}, "frame_stack": {"state": 4}}


def reads(rb: ReplayBuffer) -> list[Any]:
    """A few reads that depend on every stored byte and on the generator."""
    return [rb.sample_all(), rb.sample_batch(8, n_step=3), rb.sample_batch(8)]


def filled(tmp_path: pathlib.Path, rows: list[dict[str, Any]], size: int = 12, **kwargs: Any) -> ReplayBuffer:
    rb = ReplayBuffer("cpu", "cpu", size, seed=3, storage_dir=tmp_path / "s", **kwargs)
    for row in rows:
        rb.add(row)
    return rb


def test_bad_claims_are_refused_naming_the_argument_or_key(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="frame_stack"):
        ReplayBuffer("cpu", "cpu", 8, frame_stack={"state": 0})
    with pytest.raises(InvalidArgumentError, match="next_of"):
        ReplayBuffer("cpu", "cpu", 8, next_of={"state": "state"})
    rows = env_rows(3, 4, seed=0)
    with pytest.raises(SchemaError, match=r"'state'.*frame_stack says 3"):
        filled(tmp_path, rows, frame_stack={"state": 3})
    with pytest.raises(SchemaError, match="'obs'"):
        filled(tmp_path, rows, next_of={"next_state": "obs"})


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("broken", ["next_state", "state"])
def test_a_write_breaking_the_overlap_raises_and_stores_nothing(
    tmp_path: pathlib.Path, batch: bool, broken: str
) -> None:
    rows = env_rows(12, 4, seed=1, end_rate=0.0)
    rb = filled(tmp_path, rows[:6], **PIXELS)
    before = reads(rb)
    rb.generator.manual_seed(3)
    bad = [dict(r) for r in rows[6:9]]
    if broken == "next_state":  # the next row's state is not this row's next_state
        bad[0]["next_state"] = bad[0]["next_state"].clone()
        bad[0]["next_state"][-1, 0, 0] ^= 1
    else:  # the stack does not continue the previous row's
        bad[1]["state"] = bad[1]["state"].clone()
        bad[1]["state"][0, 0, 0] ^= 1
    with pytest.raises(SchemaError, match=f"'{broken}'"):
        if batch:
            rb.add_batch(steps_of([bad], 0, 3))
        else:
            for row in bad:
                rb.add(row)
    if not batch:  # the first row alone keeps the claims and is stored; the second one is refused
        assert len(rb) == 7
        return
    assert len(rb) == 6 and rb.pointer == 6
    rb.generator.manual_seed(3)
    for a, b in zip(before, reads(rb), strict=True):
        assert_same(a, b)
    rb.add_batch(steps_of([rows], 6, 12))  # the right rows still go in afterwards
    assert len(rb) == 12


def test_nbytes_and_checkpoint_of_1000_atari_rows_are_within_1_1x_of_the_unique_frames(
    tmp_path: pathlib.Path,
) -> None:
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (1004, 84, 84), generator=g, dtype=torch.uint8)
    ends = torch.zeros(1000, 1, dtype=torch.bool)
    ends[-1] = True
    batch = {
        "state": torch.stack([frames[t : t + 4] for t in range(1000)]),
        "next_state": torch.stack([frames[t + 1 : t + 5] for t in range(1000)]),
        "reward": torch.zeros(1000, 1),
        "terminated": ends,
        "truncated": torch.zeros(1000, 1, dtype=torch.bool),
    }
    plain = ReplayBuffer("cpu", "cpu", 1000, storage_dir=tmp_path)
    compact = ReplayBuffer("cpu", "cpu", 1000, storage_dir=tmp_path, **PIXELS)
    for rb in (plain, compact):
        rb.add_batch(batch)
    unique = frames.numel()  # 1004 frames of 84x84 bytes
    assert plain.nbytes >= 8 * 1000 * 84 * 84  # a plain buffer keeps two stacks a row
    assert compact.nbytes <= 1.1 * unique, compact.nbytes / unique
    assert_same(plain.sample_all(), compact.sample_all())
    compact.save(tmp_path / "pixels", data=True)
    saved = sum(p.stat().st_size for p in tmp_path.glob("pixels*/**/*") if p.is_file())
    saved += sum(p.stat().st_size for p in tmp_path.glob("pixels*") if p.is_file())
    assert 0.9 * unique <= saved <= 1.1 * unique, saved / unique


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_compact_checkpoint_is_about_the_unique_frames_and_round_trips(tmp_path: pathlib.Path, cls: Any) -> None:
    rows = env_rows(40, 4, seed=2)
    compact = cls("cpu", "cpu", 24, seed=3, storage_dir=tmp_path / "a", **PIXELS)
    plain = cls("cpu", "cpu", 24, seed=3, storage_dir=tmp_path / "b")
    root = tmp_path / "ckpt"
    root.mkdir()
    for rb in (compact, plain):
        for row in rows:
            rb.add(row)
        rb.save(root / ("c" if rb is compact else "p"), data=True)

    expected = reads(plain)
    for path in ("c", "p"):  # each checkpoint into each form: the same rows and generator state
        for kwargs in (PIXELS, {}):
            loaded = cls.from_checkpoint(root / path, **kwargs)
            assert (loaded.engine.compact is not None) == (bool(kwargs) or path == "c")
            for a, b in zip(expected, reads(loaded), strict=True):
                assert_same(a, b)
            loaded.close()
    back = cls("cpu", "cpu", 24, storage_dir=tmp_path / "d", **PIXELS)  # load() and load_state_dict too
    back.load(root / "c")
    assert_same(expected[0], back.sample_all())
    back.load_state_dict(plain.state_dict())
    assert back.engine.compact is not None and back.engine.storage.table is not None
    assert_same(expected[0], back.sample_all())


def test_a_plain_checkpoint_whose_rows_break_the_claims_is_refused(tmp_path: pathlib.Path) -> None:
    rows = env_rows(10, 4, seed=5, end_rate=0.0)
    rows[4] = dict(rows[4], state=torch.zeros_like(rows[4]["state"]))  # not the previous next_state
    plain = filled(tmp_path, rows)
    plain.save(tmp_path / "p", data=True)
    with pytest.raises(CheckpointError, match="'state'"):
        ReplayBuffer.from_checkpoint(tmp_path / "p", **PIXELS)
    empty = ReplayBuffer("cpu", "cpu", 12, storage_dir=tmp_path / "e", **PIXELS)
    with pytest.raises(CheckpointError, match=os.fspath(tmp_path / "p")):
        empty.load(tmp_path / "p")
    assert len(empty) == 0


def test_a_copy_of_a_compact_buffer_reads_the_same(tmp_path: pathlib.Path) -> None:
    import copy

    rb = filled(tmp_path, env_rows(30, 4, seed=6), **PIXELS)
    twin = copy.deepcopy(rb)
    assert twin.engine.compact is not None
    for a, b in zip(reads(rb), reads(twin), strict=True):
        assert_same(a, b)


def test_shared_memory_mode_serves_a_compact_buffers_rows(tmp_path: pathlib.Path) -> None:
    from objectrl_buffer.distributed.process import become_shared, is_shared

    rows = env_rows(30, 4, seed=8)
    plain, compact = filled(tmp_path, rows[:20]), filled(tmp_path, rows[:20], **PIXELS)
    become_shared(compact)  # what handing it to a child process does
    assert is_shared(compact)
    for row in rows[20:]:
        plain.add(row)
        compact.add(row)
    assert_same(plain.sample_all(), compact.sample_all())
    compact.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_child_reads_until_the_parent_writes_then_refuses(tmp_path: pathlib.Path) -> None:
    rows = env_rows(20, 4, seed=9)
    rb = filled(tmp_path, rows[:10], **PIXELS)
    expected = rb.sample_all()
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reads the parent's rows, then (after the parent wrote) must refuse
        code = 0
        try:
            if not torch.equal(rb.sample_all()["state"], expected["state"]):
                code = 2
            os.write(from_child, b"r")
            os.read(to_child, 1)
            try:
                rb.sample_batch(4)
                code = 3
            except ForkedBufferError:
                pass
        finally:
            os._exit(code)
    assert os.read(to_parent, 1) == b"r"
    rb.add(rows[10])
    os.write(from_parent, b"w")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rb.close()


@pytest.mark.parametrize("new_size", [None, 8])
def test_after_reset_a_compact_buffer_starts_new_streams(tmp_path: pathlib.Path, new_size: int | None) -> None:
    rows = env_rows(30, 4, seed=10)
    plain, compact = filled(tmp_path, rows[:15]), filled(tmp_path, rows[:15], **PIXELS)
    for rb in (plain, compact):
        rb.reset(new_size)
        rb.add_batch(steps_of([rows], 17, 30))  # not the row after the last one: a new stream
    for a, b in zip(reads(plain), reads(compact), strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("batch", [False, True])
def test_a_next_stack_that_does_not_shift_its_own_rows_stack_is_named_as_such(
    tmp_path: pathlib.Path, batch: bool
) -> None:
    """next_state[:-1] != state[1:] within one row that does not end an episode: the message says the same
    row (not the previous one), and nothing is stored."""
    rows = env_rows(12, 4, seed=1, end_rate=0.0)
    rb = filled(tmp_path, rows[:6], **PIXELS)
    bad = dict(rows[6])
    bad["next_state"] = bad["next_state"].clone()
    bad["next_state"][0, 0, 0] ^= 1  # an older frame of the next stack, not the new one
    with pytest.raises(SchemaError, match=r"'next_state'.*frames 1\.\.k-1 of 'state' in the same row"):
        if batch:
            rb.add_batch(steps_of([[bad]], 0, 1))
        else:
            rb.add(bad)
    assert len(rb) == 6 and rb.pointer == 6
