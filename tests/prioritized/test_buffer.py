"""PrioritizedReplayBuffer: the sampling distribution (chi-square), weights, priority updates and state."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, torchrl_per_available
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SlotIndexError
from objectrl_buffer.prioritized import index as priority_index

logging.getLogger("torchrl").setLevel(logging.WARNING)

DRAWS = 100_000


def chi_square_limit(df: int, z: float = 4.753) -> float:
    """Upper ``1 - 1e-6`` quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty).

    With fixed seeds a correct sampler passes deterministically; a wrong one fails by a wide margin
    (see ``test_chi_square_rejects_a_wrong_distribution``).
    """
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    """Pearson's statistic of ``counts`` against ``probabilities`` (every expected count >= 5)."""
    expected = probabilities.double() * counts.sum()
    assert bool((expected >= 5).all()), "too few draws for a chi-square test"
    return float(((counts.double() - expected) ** 2 / expected).sum())


def expected_probabilities(priority: torch.Tensor, alpha: float, eps: float) -> torch.Tensor:
    weight = (priority.double() + eps) ** alpha
    return weight / weight.sum()


def make(tmp_path: Any, capacity: int = 40, rows: int = 40, **kwargs: Any) -> PrioritizedReplayBuffer:
    kwargs.setdefault("seed", 0)
    rb = PrioritizedReplayBuffer("cpu", "cpu", capacity, storage_dir=tmp_path, **kwargs)
    if rows:
        rb.add_batch({"step": torch.arange(rows), "reward": torch.ones(rows)})
    return rb


def random_priorities(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=gen, dtype=torch.float64) * 5 + 0.01


# ---------------------------------------------------------------------------------------- distribution
@pytest.mark.parametrize(("alpha", "capacity", "rows"), [(0.6, 40, 40), (1.0, 40, 40), (0.0, 40, 40), (0.7, 30, 75)])
def test_sampling_follows_priorities(tmp_path: Any, alpha: float, capacity: int, rows: int) -> None:
    """Chi-square over 1e5 draws: slot i is drawn with probability (p_i + eps)^alpha / sum_j (...)."""
    rb = make(tmp_path, capacity, rows, alpha=alpha, eps=1e-6)
    priority = random_priorities(capacity, 1)
    rb.update_priority(torch.arange(capacity), priority)
    counts = torch.bincount(rb.sample_batch(DRAWS)["index"], minlength=capacity)
    assert chi_square(counts, expected_probabilities(priority, alpha, 1e-6)) < chi_square_limit(capacity - 1)


def test_chi_square_rejects_a_wrong_distribution(tmp_path: Any) -> None:
    """The same test has power: the draws are far from what alpha=1 (instead of 0.6) would give."""
    rb = make(tmp_path, alpha=0.6)
    priority = random_priorities(40, 1)
    rb.update_priority(torch.arange(40), priority)
    counts = torch.bincount(rb.sample_batch(DRAWS)["index"], minlength=40)
    assert chi_square(counts, expected_probabilities(priority, 1.0, 1e-6)) > 10 * chi_square_limit(39)


def test_zero_priority_rows_are_never_drawn(tmp_path: Any) -> None:
    rb = make(tmp_path, alpha=1.0, eps=0.0)
    priority = random_priorities(40, 2)
    priority[::4] = 0.0
    rb.update_priority(torch.arange(40), priority)
    counts = torch.bincount(rb.sample_batch(DRAWS)["index"], minlength=40)
    assert not counts[::4].any()
    live = priority > 0
    assert chi_square(counts[live], expected_probabilities(priority[live], 1.0, 0.0)) < chi_square_limit(29)
    rb.update_priority(torch.arange(40), torch.zeros(40))
    with pytest.raises(EmptyBufferError, match="priority 0"):
        rb.sample_batch(4)


def test_alpha_can_be_changed(tmp_path: Any) -> None:
    rb = make(tmp_path, alpha=0.2)
    priority = random_priorities(40, 3)
    rb.update_priority(torch.arange(40), priority)
    rb.alpha = 1.0
    counts = torch.bincount(rb.sample_batch(DRAWS)["index"], minlength=40)
    assert chi_square(counts, expected_probabilities(priority, 1.0, 1e-6)) < chi_square_limit(39)


@pytest.mark.skipif(not torchrl_per_available("cpu"), reason="torchrl's compiled extension does not load here")
def test_torchrl_and_own_tree_agree(tmp_path: Any) -> None:
    """Where torchrl's PrioritizedSampler loads, "auto" uses it and both give the same distribution."""
    priority = random_priorities(40, 4)
    expected = expected_probabilities(priority, 0.6, 1e-6)
    for backend in ("auto", "torch"):
        rb = make(tmp_path / backend, backend=backend)
        assert rb.backend == ("torchrl" if backend == "auto" else "torch")
        rb.update_priority(torch.arange(40), priority)
        batch = rb.sample_batch(DRAWS)
        counts = torch.bincount(batch["index"], minlength=40)
        assert chi_square(counts, expected) < chi_square_limit(39)
        check_weights(batch, priority, 0.6, 0.4, 1e-6)


class FakeSegmentTree:
    """Stand-in for torchrl's compiled segment trees (plain tensors), to run its sampler's Python code."""

    def __init__(self, capacity: int, reduce: str) -> None:
        self.reduce = reduce
        self.values = torch.full((capacity,), math.inf if reduce == "min" else 0.0, dtype=torch.float64)

    def __setitem__(self, index: Any, value: Any) -> None:
        self.values[torch.as_tensor(index)] = torch.as_tensor(value, dtype=torch.float64)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.values[torch.as_tensor(index)]

    def query(self, low: int, high: int) -> float:
        part = self.values[low:high]
        return float(part.min() if self.reduce == "min" else part.sum())

    def scan_lower_bound(self, mass: Any) -> torch.Tensor:
        cumulative = self.values.cumsum(0)  # first index whose inclusive prefix sum exceeds the mass
        return (cumulative <= torch.as_tensor(mass, dtype=torch.float64).unsqueeze(-1)).sum(-1)


@pytest.fixture
def fake_torchrl_trees(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torchrl's PrioritizedSampler as if its extension loaded (CPU trees replaced by FakeSegmentTree)."""
    from torchrl.data.replay_buffers.samplers import prioritized as module

    for name in ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64"):
        reduce = "sum" if name.startswith("Sum") else "min"
        monkeypatch.setattr(module, name, functools.partial(FakeSegmentTree, reduce=reduce))
    priority_index.forget_probes()
    yield
    priority_index.forget_probes()


def test_torchrl_adapter_drives_the_real_sampler(tmp_path: Any, fake_torchrl_trees: None) -> None:
    """Our adapter around torchrl's PrioritizedSampler (its Python code, fake trees): same distribution,
    same weights, new rows and wrap-around handled, state restored."""
    assert torchrl_per_available("cpu")
    rb = make(tmp_path, capacity=30, rows=45, backend="torchrl")
    assert rb.backend == "torchrl" and make(tmp_path / "auto").backend == "torchrl"
    priority = random_priorities(30, 4)
    rb.update_priority(torch.arange(30), priority)
    batch = rb.sample_batch(DRAWS)
    counts = torch.bincount(batch["index"], minlength=30)
    assert chi_square(counts, expected_probabilities(priority, 0.6, 1e-6)) < chi_square_limit(29)
    check_weights(batch, priority, 0.6, 0.4, 1e-6)
    rb.add({"step": torch.tensor(45), "reward": torch.tensor(1.0)})  # overwrites slot 15: max priority
    assert_draws_follow_priorities(rb)
    rb.alpha = 1.0
    other = make(tmp_path / "o", capacity=30, rows=30, backend="torchrl", alpha=1.0)
    other.load_priority_state(rb.priority_state())
    assert_draws_follow_priorities(other)
    rb.reset()
    rb.add_batch({"step": torch.arange(5), "reward": torch.ones(5)})
    assert_draws_follow_priorities(rb)


def test_auto_backend_without_the_extension_is_ours(tmp_path: Any) -> None:
    rb = make(tmp_path)
    assert rb.backend == ("torchrl" if torchrl_per_available("cpu") else "torch")
    assert make(tmp_path / "b", eps=0.0).backend == "torch"  # torchrl refuses zero weights
    if not torchrl_per_available("cpu"):
        with pytest.raises(InvalidArgumentError, match="torchrl"):
            make(tmp_path / "c", backend="torchrl")


# ---------------------------------------------------------------------------------------- weights
def check_weights(batch: Any, priority: torch.Tensor, alpha: float, beta: float, eps: float) -> None:
    """weight_i = (N P(i))^-beta / max_j (N P(j))^-beta over the batch, from the formula in float64."""
    p = [(float(priority[s]) + eps) ** alpha for s in batch["index"].tolist()]
    total = sum((float(x) + eps) ** alpha for x in priority.tolist())
    n = priority.numel()
    raw = [(n * q / total) ** -beta for q in p]
    largest = max(raw)
    expected = torch.tensor([w / largest for w in raw], dtype=torch.float32)
    assert batch["weight"].dtype == torch.float32
    torch.testing.assert_close(batch["weight"], expected, rtol=2e-6, atol=0.0)
    assert float(batch["weight"].max()) == 1.0


@pytest.mark.parametrize(("alpha", "beta"), [(0.6, 0.4), (1.0, 1.0), (0.5, 0.0), (0.0, 0.7), (2.0, 0.5)])
def test_weights_match_the_formula(tmp_path: Any, alpha: float, beta: float) -> None:
    rb = make(tmp_path, alpha=alpha, beta=beta)
    priority = random_priorities(40, 5)
    rb.update_priority(torch.arange(40), priority)
    check_weights(rb.sample_batch(256), priority, alpha, beta, 1e-6)


def test_beta_can_be_annealed(tmp_path: Any) -> None:
    rb = make(tmp_path, beta=0.4)
    priority = random_priorities(40, 6)
    rb.update_priority(torch.arange(40), priority)
    for beta in (0.5, 0.8, 1.0):
        rb.beta = beta
        check_weights(rb.sample_batch(128), priority, 0.6, beta, 1e-6)
    for bad in (-0.1, 1.5, float("nan"), "1"):
        with pytest.raises(InvalidArgumentError, match="beta"):
            rb.beta = bad
    assert rb.beta == 1.0


# ---------------------------------------------------------------------------------------- priorities
def test_update_priority_last_duplicate_wins_and_accepts_columns(tmp_path: Any) -> None:
    rb = make(tmp_path, rows=10)
    rb.update_priority(torch.tensor([3, 5, 3, 3]), torch.tensor([1.0, 2.0, 7.0, 4.0]))
    rb.update_priority([6, 7], np.array([[0.5], [0.25]]))  # a [k, 1] column of TD errors
    rb.update_priority(8, 0.125)
    td_error = torch.tensor([3.0], requires_grad=True) * 2
    rb.update_priority(torch.tensor([9]), td_error.abs())  # not differentiated through
    got = rb.priorities().tolist()
    assert got[3] == 4.0 and got[5] == 2.0 and got[6:10] == [0.5, 0.25, 0.125, 6.0]
    assert got[:3] == [1.0] * 3 and got[4] == 1.0


@pytest.mark.parametrize(
    ("index", "priority", "error", "match"),
    [
        ([1, 2, 3], [1.0, 2.0], InvalidArgumentError, "shape"),
        (torch.zeros(2, 3, dtype=torch.long), torch.ones(3, 2), InvalidArgumentError, "shape"),
        ([1, 2], [1.0, -0.5], InvalidArgumentError, "finite and >= 0"),
        ([1, 2], [float("nan"), 1.0], InvalidArgumentError, "finite and >= 0"),
        ([1, 2], [1.0, float("inf")], InvalidArgumentError, "finite and >= 0"),
        ([1, 2], ["a", "b"], InvalidArgumentError, "priority"),
        ([1, 10], [1.0, 2.0], SlotIndexError, "out of range"),
        ([-1], [1.0], SlotIndexError, "out of range"),
        (torch.tensor([1.5]), [1.0], InvalidArgumentError, "integers"),
        ([0.5], [2.0], InvalidArgumentError, "index"),  # was read as slot 0
        ([True], [2.0], InvalidArgumentError, "index"),
        ([1 + 0j], [2.0], InvalidArgumentError, "index"),
        (np.array([1.0]), [2.0], InvalidArgumentError, "index"),
        (torch.tensor([1 + 0j]), [2.0], InvalidArgumentError, "index"),
        (1.0, 2.0, InvalidArgumentError, "index"),
    ],
)
def test_bad_updates_raise_and_change_nothing(
    tmp_path: Any, index: Any, priority: Any, error: type[Exception], match: str
) -> None:
    rb = make(tmp_path, rows=10)
    rb.update_priority(torch.arange(10), random_priorities(10, 7))
    before = rb.priority_state()
    with pytest.raises(error, match=match):
        rb.update_priority(index, priority)
    after = rb.priority_state()
    assert all(torch.equal(before[k], after[k]) for k in before)


def assert_draws_follow_priorities(rb: PrioritizedReplayBuffer, draws: int = 40_000) -> None:
    """The index the buffer samples from agrees with the priorities it reports (chi-square)."""
    priority = rb.priorities()
    counts = torch.bincount(rb.sample_batch(draws)["index"], minlength=len(rb))
    expected = expected_probabilities(priority, rb.alpha, rb.eps)
    assert chi_square(counts, expected) < chi_square_limit(len(rb) - 1)


def test_new_rows_get_the_max_priority_also_when_the_ring_wraps(tmp_path: Any) -> None:
    rb = make(tmp_path, capacity=4, rows=4)
    assert rb.priorities().tolist() == [1.0] * 4 and rb.max_priority == 1.0
    rb.update_priority([0, 1, 2, 3], [0.1, 0.2, 3.0, 0.3])
    assert rb.max_priority == 3.0
    rb.add({"step": torch.tensor(4), "reward": torch.tensor(1.0)})  # overwrites slot 0 (stale 0.1)
    assert rb.priorities().tolist() == [3.0, 0.2, 3.0, 0.3]
    assert_draws_follow_priorities(rb)
    rb.update_priority([2], [0.01])
    assert rb.max_priority == 3.0  # the largest ever given, not the largest now stored
    rb.add_batch({"step": torch.tensor([5, 6]), "reward": torch.ones(2)})  # slots 1, 2
    assert rb.priorities().tolist() == [3.0, 3.0, 3.0, 0.3]
    assert_draws_follow_priorities(rb)
    rb.update_priority([0, 1, 2, 3], [0.5, 0.1, 0.2, 0.3])
    rb.add_batch({"step": torch.arange(9), "reward": torch.ones(9)})  # more rows than the capacity
    assert rb.priorities().tolist() == [3.0] * 4 and rb.pointer == 0
    assert_draws_follow_priorities(rb)


def test_single_adds_into_a_large_buffer_keep_the_index_in_step(tmp_path: Any) -> None:
    rb = make(tmp_path, capacity=3000, rows=0, alpha=1.0)
    for step in range(40):
        rb.add({"step": torch.tensor(step), "reward": torch.tensor(1.0)})
        if step % 8 == 0:
            rb.update_priority([step], [0.1 + step])
    assert_draws_follow_priorities(rb)


def test_reset_clears_priorities(tmp_path: Any) -> None:
    rb = make(tmp_path, rows=10)
    rb.update_priority([0, 1], [9.0, 8.0])
    rb.reset()
    assert rb.max_priority == 1.0 and not rb.priority_state()["priority"].any() and len(rb.priorities()) == 0
    rb.add_batch({"step": torch.arange(3), "reward": torch.ones(3)})
    assert rb.priorities().tolist() == [1.0] * 3
    rb.reset(7)
    assert rb.priority_state()["priority"].shape == (7,)
    with pytest.raises(InvalidArgumentError):
        rb.reset(0)
    assert rb.buffer_size == 7


def test_priority_state_round_trip(tmp_path: Any) -> None:
    a, b = make(tmp_path / "a", seed=5), make(tmp_path / "b", seed=5)
    a.update_priority(torch.arange(40), random_priorities(40, 8))
    a.update_priority([3], [50.0])
    state = a.priority_state()
    assert state["priority"].dtype == torch.float64 and state["priority"].device.type == "cpu"
    b.load_priority_state(state)
    assert b.max_priority == 50.0
    for _ in range(3):
        x, y = a.sample_batch(64), b.sample_batch(64)
        assert torch.equal(x["index"], y["index"]) and torch.equal(x["weight"], y["weight"])
    state["priority"][0] = 123.0  # the exported state is a copy
    assert a.priorities()[0] != 123.0


@pytest.mark.parametrize(
    "state",
    [
        {"priority": torch.ones(40)},
        {"priority": torch.ones(39), "max_priority": torch.tensor(1.0)},
        {"priority": -torch.ones(40), "max_priority": torch.tensor(1.0)},
        {"priority": torch.ones(40), "max_priority": torch.tensor(float("nan"))},
    ],
)
def test_bad_priority_state_raises_and_changes_nothing(tmp_path: Any, state: dict[str, torch.Tensor]) -> None:
    rb = make(tmp_path)
    rb.update_priority(torch.arange(40), random_priorities(40, 9))
    before = rb.priority_state()
    with pytest.raises(InvalidArgumentError):
        rb.load_priority_state(state)
    assert all(torch.equal(before[k], rb.priority_state()[k]) for k in before)


def test_metadata_load_restarts_uniform_priorities(tmp_path: Any) -> None:
    a = make(tmp_path / "a", capacity=10, rows=6)
    a.update_priority([0], [4.0])
    a.save(tmp_path / "ckpt")
    b = PrioritizedReplayBuffer("cpu", "cpu", 20, storage_dir=tmp_path / "b")
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        b.load(tmp_path / "ckpt")
    assert b.buffer_size == 10 and b.priorities().tolist() == [1.0] * 6


# ---------------------------------------------------------------------------------------- construction and API
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"alpha": float("inf")}, "alpha"),
        ({"beta": -0.01}, "beta"),
        ({"beta": 1.01}, "beta"),
        ({"eps": -1e-6}, "eps"),
        ({"backend": "cuda-tree"}, "backend"),
        ({"eps": 1e300, "alpha": 2.0}, "eps"),  # every new row's weight (1 + eps) ** alpha would overflow
    ],
)
def test_bad_construction_raises(tmp_path: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        PrioritizedReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path, **kwargs)


def test_same_seed_same_samples_and_the_rest_of_the_api(tmp_path: Any) -> None:
    a, b = make(tmp_path / "a", seed=1), make(tmp_path / "b", seed=1)
    assert torch.equal(a.sample_batch(100)["index"], b.sample_batch(100)["index"])
    assert "weight" in a.get_next_batch(8)  # random batches of get_next_batch are prioritized
    epoch = list(a.create_epoch_iterator(16))  # epochs stay uniform passes over every row
    assert sorted(s for batch in epoch for s in batch["step"].tolist()) == list(range(40))
    assert "PrioritizedReplayBuffer" in repr(a) and "alpha=0.6" in repr(a)


def test_prioritized_n_step(tmp_path: Any) -> None:
    rb = make(tmp_path, capacity=10, rows=0)
    zeros = torch.zeros(10)
    rb.add_batch({"reward": torch.ones(10), "next_state": zeros, "terminated": zeros, "truncated": zeros})
    rb.update_priority([9], [100.0])  # the newest row: its n-step sum stops at the write head
    batch = rb.sample_batch(500, n_step=3, gamma=0.5)
    for slot, reward, discount in zip(
        batch["index"].tolist(), batch["reward"].tolist(), batch["discount"].tolist(), strict=True
    ):
        steps = min(3, 10 - slot)
        assert reward == sum(0.5**j for j in range(steps)) and discount == 0.5**steps
    assert "weight" in batch and float(batch["weight"].max()) == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_storage(tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cuda", "cuda", 40, seed=0, alpha=0.6)
    rb.add_batch({"step": torch.arange(40, device="cuda")})
    priority = random_priorities(40, 1)
    rb.update_priority(torch.arange(40, device="cuda"), priority.cuda())
    batch = rb.sample_batch(DRAWS)
    assert batch["weight"].device.type == "cuda"
    counts = torch.bincount(batch["index"].cpu(), minlength=40)
    assert chi_square(counts, expected_probabilities(priority, 0.6, 1e-6)) < chi_square_limit(39)


def test_close_frees_the_priorities_and_their_tree(tmp_path: Any) -> None:
    import gc
    import weakref

    rb = make(tmp_path, capacity=1000, rows=10)
    own = rb.checkpoint_extras[0]  # the buffer's Priorities
    priority, index = weakref.ref(own.priority), weakref.ref(own.index)
    del own
    rb.close()
    gc.collect()
    assert priority() is None and index() is None  # freed with the buffer's rows, not when rb is
    assert len(rb) == 0
    with pytest.raises(EmptyBufferError):
        rb.sample_batch(2)


def test_add_batch_gives_max_priority_to_exactly_the_rows_written_whatever_the_input_form(tmp_path: Any) -> None:
    from tensordict import TensorDict

    rb = make(tmp_path, capacity=5, rows=0)
    rb.add_batch({"step": torch.arange(3), "reward": torch.ones(3)})  # slots 0-2
    rb.update_priority([0, 1, 2], [0.5, 0.25, 4.0])
    rb.add_batch({"step": np.arange(0), "reward": np.ones(0, dtype=np.float32)})  # nothing written
    assert rb.priorities().tolist() == [0.5, 0.25, 4.0] and rb.pointer == 3
    rb.add_batch(TensorDict({"step": torch.arange(3), "reward": torch.ones(3)}, [3]))  # slots 3, 4, 0
    assert rb.priority_state()["priority"].tolist() == [4.0, 0.25, 4.0, 4.0, 4.0]
    with pytest.raises(ValueError):
        rb.add_batch({"step": torch.arange(2), "reward": torch.ones(3)})  # rows disagree: nothing written
    assert rb.priority_state()["priority"].tolist() == [4.0, 0.25, 4.0, 4.0, 4.0] and rb.pointer == 1
    assert_draws_follow_priorities(rb)


# ---------------------------------------------------------------------------------------- recency window
def window_reference(rb: PrioritizedReplayBuffer, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots of the newest ``min(m, len)`` rows and their probabilities, renormalised over the window (NumPy)."""
    size, capacity, pointer = len(rb), rb.buffer_size, rb.pointer
    count = min(m, size)
    slots = np.array([(pointer - count + j) % capacity for j in range(count)])
    weight = (rb.priorities().numpy()[slots] + rb.eps) ** rb.alpha
    return slots, weight / weight.sum()


def check_window_batch(rb: PrioritizedReplayBuffer, batch: Any, m: int) -> None:
    """Only window slots; weights (N_w P(i))^-beta / max over the batch, P renormalised over the window."""
    slots, probability = window_reference(rb, m)
    p_of = dict(zip(slots.tolist(), probability.tolist(), strict=True))
    drawn = batch["index"].tolist()
    assert set(drawn) <= set(p_of)
    raw = np.array([(len(slots) * p_of[s]) ** -rb.beta for s in drawn])
    expected = torch.tensor(raw / raw.max(), dtype=torch.float32)
    assert batch["weight"].dtype == torch.float32
    torch.testing.assert_close(batch["weight"], expected, rtol=2e-6, atol=0.0)
    assert float(batch["weight"].max()) == 1.0


@pytest.mark.parametrize(
    ("capacity", "rows", "m"),
    [(40, 40, 15), (30, 75, 20), (30, 75, 12), (40, 25, 100), (40, 40, 1), (1000, 2500, 600)],
    ids=["full", "across-the-ring-end", "before-the-pointer", "window-past-size", "one-row", "deep-tree"],
)
@pytest.mark.parametrize("backend", ["torch", "torchrl"])
def test_recent_window_draws_follow_priorities_renormalised_over_the_window(
    tmp_path: Any, request: pytest.FixtureRequest, backend: str, capacity: int, rows: int, m: int
) -> None:
    """Chi-square over 1e5 draws against (p_i + eps)^alpha / sum over the newest m rows; exact weights."""
    if backend == "torchrl":
        request.getfixturevalue("fake_torchrl_trees")  # torchrl's sampler cannot restrict: the fallback path
    rb = make(tmp_path, capacity, rows, alpha=0.7, beta=0.6, backend=backend)
    rb.update_priority(torch.arange(len(rb)), random_priorities(len(rb), 11))
    rb.add_batch({"step": torch.arange(3) + rows, "reward": torch.ones(3)})  # new rows at max priority
    assert rb.backend == backend
    slots, probability = window_reference(rb, m)
    batch = rb.sample_batch(DRAWS, recent=m)
    counts = torch.bincount(batch["index"], minlength=capacity)
    assert int(counts[slots].sum()) == DRAWS  # nothing outside the window
    if len(slots) > 1:
        assert chi_square(counts[slots], torch.from_numpy(probability)) < chi_square_limit(len(slots) - 1)
    check_window_batch(rb, rb.sample_batch(256, recent=m), m)
    if m >= len(rb):  # a window holding every row draws exactly as no window
        state = rb.generator.get_state()
        whole = rb.sample_batch(64)
        rb.generator.set_state(state)
        assert torch.equal(rb.sample_batch(64, recent=m)["index"], whole["index"])


def test_recent_window_with_n_step_and_get_next_batch(tmp_path: Any) -> None:
    rb = make(tmp_path, capacity=10, rows=0, alpha=1.0)
    zeros = torch.zeros(14)
    rb.add_batch(
        {
            "step": torch.arange(14),
            "reward": torch.ones(14),
            "next_state": zeros,
            "terminated": zeros,
            "truncated": zeros,
        }
    )
    rb.update_priority(torch.arange(10), random_priorities(10, 12))
    batch = rb.sample_batch(2000, n_step=3, gamma=0.5, recent=4)  # steps 10..13 sit in slots 0..3
    assert set(batch["step"].tolist()) == {10, 11, 12, 13}
    for step, reward, discount in zip(
        batch["step"].tolist(), batch["reward"].tolist(), batch["discount"].tolist(), strict=True
    ):
        steps = min(3, 14 - step)  # the write head stops the sum
        assert reward == sum(0.5**j for j in range(steps)) and discount == 0.5**steps
    check_window_batch(rb, batch, 4)
    assert rb.get_steps_and_iterator(0, 7, 8, recent=3) == 7
    nxt = rb.get_next_batch(3000)  # random batches of get_next_batch: prioritized over the newest 3 rows
    assert set(nxt["step"].tolist()) == {11, 12, 13}
    check_window_batch(rb, nxt, 3)
    counts = torch.bincount(nxt["index"], minlength=10)
    slots, probability = window_reference(rb, 3)
    assert chi_square(counts[slots], torch.from_numpy(probability)) < chi_square_limit(2)
    rb.get_steps_and_iterator(0, 7, 8)
    assert set(rb.get_next_batch(3000)["step"].tolist()) == set(range(4, 14))


@pytest.mark.parametrize("backend", ["torch", "torchrl"])
def test_a_window_of_zero_priorities_raises(tmp_path: Any, request: pytest.FixtureRequest, backend: str) -> None:
    if backend == "torchrl":
        request.getfixturevalue("fake_torchrl_trees")
    rb = make(tmp_path, capacity=10, rows=10, eps=0.0, backend=backend)
    rb.update_priority([7, 8, 9], [0.0, 0.0, 0.0])
    state = rb.generator.get_state()
    with pytest.raises(EmptyBufferError, match="priority 0"):
        rb.sample_batch(4, recent=3)
    assert torch.equal(rb.generator.get_state(), state)
    assert set(rb.sample_batch(100, recent=4)["index"].tolist()) == {6}


@pytest.mark.parametrize("recent", [0, -1, 2.5, "3", True])
def test_bad_recent_raises_and_changes_nothing(tmp_path: Any, recent: Any) -> None:
    rb = make(tmp_path, rows=10)
    state = rb.generator.get_state()
    with pytest.raises(InvalidArgumentError, match="recent"):
        rb.sample_batch(4, recent=recent)
    with pytest.raises(InvalidArgumentError, match="recent"):
        rb.get_steps_and_iterator(0, 5, 4, recent=recent)
    assert torch.equal(rb.generator.get_state(), state)


# ---------------------------------------------------------------------------------------- extreme priorities
def test_a_priority_whose_weight_overflows_is_refused(tmp_path: Any) -> None:
    """alpha=2 and a priority of 1e200 used to give inf weights: NaN importance weights and only slot 0."""
    rb = make(tmp_path, alpha=2.0)
    rb.update_priority(torch.arange(40), random_priorities(40, 13))
    before = rb.priority_state()
    state = rb.generator.get_state()
    with pytest.raises(InvalidArgumentError, match="priority"):
        rb.update_priority([0], [1e200])
    with pytest.raises(InvalidArgumentError, match="priority"):  # finite alone, but 40 of them overflow the sum
        rb.update_priority([0], [math.sqrt(1.7e308 / 10)])
    rb.update_priority([0], [math.sqrt(1.7e308 / 80)])  # fits: new rows may all take it, and their sum is finite
    assert rb.max_priority == math.sqrt(1.7e308 / 80)
    rb.update_priority([0], [1.0])
    after = rb.priority_state()
    before["priority"][0], before["max_priority"] = 1.0, after["max_priority"]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(rb.generator.get_state(), state)
    with pytest.raises(InvalidArgumentError, match="alpha"):  # the new alpha would overflow the largest priority
        rb.alpha = 3.0
    assert rb.alpha == 2.0
    with pytest.raises(InvalidArgumentError, match="priority"):
        rb.load_priority_state(
            {"priority": torch.full((40,), 1e200, dtype=torch.float64), "max_priority": after["max_priority"]}
        )
    assert all(torch.equal(after[k], rb.priority_state()[k]) for k in after)
    assert bool(rb.sample_batch(1000)["weight"].isfinite().all())


EXTREME = [0.0, 5e-324, 1e-300, 1e-150, 1e-6, 1.0, 3.5, 1e150, 1e200, 1e300, 1.7e308]


@settings(max_examples=120, deadline=None)
@given(
    alpha=st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.0]),
    beta=st.sampled_from([0.0, 0.01, 0.4, 1.0]),
    eps=st.sampled_from([0.0, 1e-300, 1e-6, 1.0]),
    priorities=st.lists(st.one_of(st.sampled_from(EXTREME), st.floats(0.0, 1.7e308)), min_size=1, max_size=8),
    recent=st.one_of(st.none(), st.integers(1, 8)),
)
def test_extreme_priorities_are_refused_or_give_exact_finite_weights(
    tmp_path_factory: Any, alpha: float, beta: float, eps: float, priorities: list[float], recent: int | None
) -> None:
    """Every update is refused with nothing changed, or accepted; then weights are never NaN and equal
    (N P(i))^-beta / max over the batch, computed in NumPy (in logs, so no overflow in the reference)."""
    rb = make(tmp_path_factory.mktemp("x"), capacity=8, rows=8, alpha=alpha, beta=beta, eps=eps, backend="torch")
    for slot, p in enumerate(priorities):
        before = rb.priority_state()
        try:
            rb.update_priority([slot], [p])
        except InvalidArgumentError as exc:
            assert "priority" in str(exc)
            assert all(torch.equal(before[k], rb.priority_state()[k]) for k in before)
    q = rb.priorities().numpy() + eps
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        weight = q**alpha
        assert np.isfinite(weight.max() * 8)  # what was accepted keeps the total finite
    window = (
        np.arange(8)
        if recent is None
        else np.array([(rb.pointer - min(recent, 8) + j) % 8 for j in range(min(recent, 8))])
    )
    if not weight[window].sum() > 0:
        with pytest.raises(EmptyBufferError):
            rb.sample_batch(4, recent=recent)
        return
    batch = rb.sample_batch(256, recent=recent)
    drawn = batch["index"].numpy()
    assert set(drawn.tolist()) <= set(window.tolist()) and bool((weight[drawn] > 0).all())
    got = batch["weight"]
    assert bool(got.isfinite().all()) and float(got.max()) == 1.0 and float(got.min()) >= 0.0
    if alpha == 0 or beta == 0:
        expected = np.ones(len(drawn))
    else:
        log_weight = alpha * np.log(q[drawn])
        expected = np.exp(-beta * (log_weight - log_weight.min()))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-30)
