"""A shard's lifetimes without Ray actors (issue 27): each "kill" drops the shard object and builds it again
from the checkpoint root, as Ray's restart does; ``lost`` adds up over every restart whatever cuts, commits
and re-sent writes came between (rows held + rows lost == rows acknowledged)."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.cut import generation_folder, journal_path, write_manifest
from objectrl_buffer.distributed.shard import Shard
from objectrl_buffer.errors import CheckpointError
from tests.support import rows

pytest.importorskip("ray")  # Shard imports it to ask whether it was restarted (resume=True here: never asked)


class Lifetimes:
    """One shard and the coordinator's part of a cut (save, manifest, commit), killed and restarted at will."""

    def __init__(self, tmp: Any) -> None:
        self.tmp, self.root = tmp, str(tmp / "ckpt")
        self.lives = 0
        self.generation = 0
        self.acked: set[int] = set()
        self.next_id = 0
        self.seqs = {"a": 0, "b": 0}
        self.unacked: tuple[str, int, dict[str, Any], list[int]] | None = None
        self.shard = self.start()

    def start(self) -> Shard:
        self.lives += 1
        kwargs = {"seed": 0, "storage_dir": str(self.tmp / f"life-{self.lives}")}
        return Shard(ReplayBuffer, ("cpu", "cpu", 100_000), kwargs, 0, self.root, resume=True)

    def write(self, writer: str, n: int, acked: bool = True) -> None:
        ids = list(range(self.next_id, self.next_id + n))
        data = {k: v.numpy() for k, v in rows(self.next_id, n).items()}
        self.next_id += n
        seq = self.seqs[writer]
        self.seqs[writer] += 1
        self.shard.add_batch(data, writer, seq)
        if acked:
            self.acked.update(ids)
        else:  # stored, its answer lost: the writer sends it again after the restart
            self.unacked = (writer, seq, data, ids)

    def cut(self, commit: bool = True) -> None:
        self.generation += 1
        os.makedirs(generation_folder(self.root, self.generation), exist_ok=True)
        held = self.shard.checkpoint(self.generation)
        write_manifest(self.root, {"generation": self.generation, "rows": [held], "kept": [self.generation]})
        if commit:
            self.shard.commit(self.generation)

    def kill(self, commit_late: bool = False) -> None:
        self.shard.journal.close()  # what the process's death does; its lines are on disk already
        self.shard = self.start()
        if commit_late:  # the commit of the last cut reaches the restarted shard (saved by the one before)
            self.shard.commit(self.generation)
        if self.unacked is not None:
            writer, seq, data, ids = self.unacked
            self.shard.add_batch(data, writer, seq)  # the retry: stored once, no longer lost
            self.acked.update(ids)
            self.unacked = None

    def check(self) -> tuple[int, int, int]:
        steps = (
            [int(s) // 1000 for s in self.shard.buffer.sample_all()["step"].tolist()] if len(self.shard.buffer) else []
        )
        assert len(steps) == len(set(steps)) and set(steps) <= self.acked  # nothing twice, nothing unacknowledged
        assert len(steps) + self.shard.lost == len(self.acked), (len(steps), self.shard.lost, len(self.acked))
        return len(steps), self.shard.lost, len(self.acked)


def test_lost_rows_add_up_over_eight_restarts_with_cuts_between(tmp_path: Any) -> None:
    """The issue's run, without actors: 8 kills with a cut before each and rows written after it."""
    life = Lifetimes(tmp_path)
    life.write("a", 30)
    for _ in range(8):
        life.write("a", 20)
        life.cut()
        life.write("b", 5)
        life.write("a", 5)
        life.kill()
        life.check()
    assert life.check() == (30 + 8 * 20, 8 * 10, 30 + 8 * 30)


def test_lost_rows_add_up_over_restarts_cuts_commits_and_retries_in_any_order(tmp_path: Any) -> None:
    """Random runs of writes, cuts (committed, or not before the kill, or committed only by the restarted
    shard), kills with no cut since the last one (the journal then holds several lifetimes, whose ``written``
    counts overlap) and writes whose answer was lost and that are sent again after the restart."""
    rng = random.Random(27)
    for run in range(2):
        life = Lifetimes(tmp_path / f"run-{run}")
        for _ in range(30):
            step = rng.random()
            if step < 0.5:
                life.write(rng.choice("ab"), rng.randint(1, 6))
            elif step < 0.65:
                life.cut()
            elif step < 0.75:
                life.cut(commit=False)
                life.kill(commit_late=rng.random() < 0.5)
            else:
                if rng.random() < 0.4:
                    life.write(rng.choice("ab"), rng.randint(1, 6), acked=False)
                life.kill()
            life.check()
        assert life.lives > 4


def test_a_garbled_journal_line_is_refused_naming_the_file(tmp_path: Any) -> None:
    life = Lifetimes(tmp_path)
    life.write("a", 3)
    life.shard.journal.close()
    with open(journal_path(life.root, 0), "a") as f:
        f.write("a x 3 3\n")
    with pytest.raises(CheckpointError, match=r"shard-0\.journal' line 2"):
        life.start()
