"""SumTree against a plain reference: cumulative sums and a binary search over the leaf weights."""

from __future__ import annotations

import bisect
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.sampling.sum_tree import SumTree

# Capacities around the level boundaries of a 32-ary tree (1, 2 and 3 levels) and a deep one.
CAPACITIES = [1, 2, 31, 32, 33, 1023, 1024, 1025, 40_000]


def reference_find(weights: list[float], mass: float) -> int:
    """First slot whose cumulative weight exceeds ``mass``; the last positive slot if none does."""
    cumulative = list(itertools.accumulate(weights))
    slot = bisect.bisect_right(cumulative, mass)
    if slot >= len(weights):
        slot = max(i for i, w in enumerate(weights) if w > 0)
    return slot


def assert_consistent(tree: SumTree) -> None:
    """Every stored sum equals the sum of its children (integer weights: exact in float64)."""
    b = tree.branching
    for below, above in itertools.pairwise(tree.levels):
        sums = below.view(-1, b).sum(1)
        assert torch.equal(above[: sums.numel()], sums)
        assert not above[sums.numel() :].any()
    assert tree.total() == tree.leaves.sum()


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_find_matches_reference_on_integer_weights(capacity: int) -> None:
    gen = torch.Generator().manual_seed(capacity)
    weights = torch.randint(0, 4, (capacity,), generator=gen).double()  # many zeros in between
    weights[-1] = 1.0
    tree = SumTree(capacity)
    tree.rebuild(weights)
    assert_consistent(tree)
    total = float(weights.sum())
    # Exact boundaries (integers) and random interior points.
    masses = torch.cat([torch.arange(0, total), torch.rand(2000, generator=gen, dtype=torch.float64) * total])
    found = tree.find(masses)
    expected = torch.searchsorted(weights.cumsum(0), masses, right=True)
    assert torch.equal(found, expected)
    assert bool((weights[found] > 0).all())


def test_mass_at_or_beyond_total_lands_on_last_positive_slot() -> None:
    weights = [0.0, 2.0, 0.0, 3.0, 0.0, 0.0]
    tree = SumTree(len(weights))
    tree.rebuild(torch.tensor(weights, dtype=torch.float64))
    found = tree.find(torch.tensor([5.0, 7.5, 1e300], dtype=torch.float64))
    assert found.tolist() == [3, 3, 3] == [reference_find(weights, m) for m in (5.0, 7.5, 1e300)]


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 3000),
    ops=st.lists(
        st.tuples(st.sampled_from(["update", "one", "rebuild"]), st.integers(0, 2**31 - 1)), min_size=1, max_size=12
    ),
)
def test_incremental_updates_equal_a_fresh_build(capacity: int, ops: list[tuple[str, int]]) -> None:
    """Any mix of update/update_one/rebuild leaves the tree equal to one built from its final leaves."""
    tree = SumTree(capacity)
    reference = [0.0] * capacity
    for op, seed in ops:
        gen = torch.Generator().manual_seed(seed)
        if op == "rebuild":
            new = torch.randint(0, 9, (capacity,), generator=gen).double()
            tree.rebuild(new)
            reference = new.tolist()
        elif op == "one":
            slot = int(torch.randint(0, capacity, (1,), generator=gen))
            value = float(torch.randint(0, 9, (1,), generator=gen))
            tree.update_one(slot, value)
            reference[slot] = value
        else:
            k = int(torch.randint(1, capacity + 1, (1,), generator=gen))
            slots = torch.randperm(capacity, generator=gen)[:k]  # distinct, unsorted; large k rebuilds
            values = torch.randint(0, 9, (k,), generator=gen).double()
            tree.update(slots, values)
            for s, v in zip(slots.tolist(), values.tolist(), strict=True):
                reference[s] = v
    assert tree.leaves.tolist() == reference
    assert_consistent(tree)
    if sum(reference) > 0:
        masses = [0.0, sum(reference) / 3, sum(reference) - 0.5]
        found = tree.find(torch.tensor(masses, dtype=torch.float64)).tolist()
        assert found == [reference_find(reference, m) for m in masses]


def test_zero_weight_slots_are_never_drawn() -> None:
    capacity = 5000
    gen = torch.Generator().manual_seed(1)
    weights = torch.rand(capacity, generator=gen, dtype=torch.float64)
    weights[::3] = 0.0  # every third slot has no weight
    weights[4000:] = 0.0  # nor does the tail (slots that hold no row)
    tree = SumTree(capacity)
    tree.rebuild(weights)
    slots = tree.sample(200_000, torch.Generator().manual_seed(2))
    assert bool((weights[slots] > 0).all())


def test_tiny_weights_next_to_huge_ones_keep_their_share() -> None:
    """float64 sums: a weight 1e-12 of the total is still drawn exactly where its mass falls."""
    weights = torch.tensor([1e12, 1.0, 1e12, 0.0], dtype=torch.float64)
    tree = SumTree(4)
    tree.rebuild(weights)
    assert tree.find(torch.tensor([1e12 + 0.5], dtype=torch.float64)).tolist() == [1]


def test_sampling_is_reproducible_with_a_seeded_generator() -> None:
    tree = SumTree(100)
    tree.rebuild(torch.arange(100, dtype=torch.float64))
    a = tree.sample(1000, torch.Generator().manual_seed(7))
    b = tree.sample(1000, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_clear_and_branching() -> None:
    tree = SumTree(100, branching=4)
    assert len(tree.levels) == 4  # 100 -> 25 -> 7 -> 2 entries
    tree.rebuild(torch.ones(100, dtype=torch.float64))
    assert float(tree.total()) == 100.0
    tree.clear()
    assert float(tree.total()) == 0.0 and not tree.leaves.any()


@pytest.mark.parametrize(
    "kwargs", [{"capacity": 0}, {"capacity": 10, "branching": 3}, {"capacity": 10, "branching": 1}]
)
def test_bad_construction_raises(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SumTree(**kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tree_matches_cpu() -> None:
    weights = torch.randint(0, 5, (3000,), generator=torch.Generator().manual_seed(0)).double()
    cpu, cuda = SumTree(3000), SumTree(3000, "cuda")
    cpu.rebuild(weights)
    cuda.rebuild(weights.cuda())
    masses = torch.rand(5000, dtype=torch.float64) * float(weights.sum())
    assert torch.equal(cpu.find(masses), cuda.find(masses.cuda()).cpu())


def reference_find_in(weights: list[float], ranges: list[tuple[int, int]], mass: float) -> int:
    """``reference_find`` over the slots of ``ranges`` only (in range order), mapped back to slots."""
    slots = [s for lo, hi in ranges for s in range(lo, hi)]
    return slots[reference_find([weights[s] for s in slots], mass)]


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.sampled_from([*CAPACITIES[:-1], 3000]),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_find_in_ranges_matches_reference_on_integer_weights(capacity: int, cuts: list[float], seed: int) -> None:
    """Masses in [0, total of the ranges) map to the slot a search over the ranges' weights alone gives."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randint(0, 4, (capacity,), generator=gen).double()
    bounds = sorted({min(capacity, int(c * (capacity + 1))) for c in cuts})
    ranges = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if lo < hi][::2]  # one or two disjoint ranges
    if not ranges:
        ranges = [(0, capacity)]
    live = [s for lo, hi in ranges for s in range(lo, hi)]
    weights[live[-1]] = 1.0  # some mass in the ranges
    tree = SumTree(capacity)
    tree.rebuild(weights)
    total = float(sum(weights[s] for s in live))
    assert float(tree.total_in(ranges)) == total
    masses = torch.cat([torch.arange(0, total), torch.rand(300, generator=gen, dtype=torch.float64) * total])
    masses = torch.cat([masses, torch.tensor([total, 2 * total], dtype=torch.float64)])  # beyond: last positive
    found = tree.find_in(masses, ranges).tolist()
    assert found == [reference_find_in(weights.tolist(), ranges, m) for m in masses.tolist()]


def test_a_light_window_after_heavy_slots_keeps_its_resolution() -> None:
    """The window's masses are not offset by the (huge) mass before it, so every slot stays reachable."""
    weights = torch.cat([torch.full((2000,), 1e20, dtype=torch.float64), torch.tensor([1.0, 0.0, 2.0, 3.0])])
    tree = SumTree(weights.numel())
    tree.rebuild(weights)
    ranges = [(2000, 2004)]
    assert float(tree.total_in(ranges)) == 6.0
    found = tree.find_in(torch.tensor([0.5, 1.0, 2.5, 3.0, 5.9], dtype=torch.float64), ranges)
    assert found.tolist() == [2000, 2002, 2002, 2003, 2003]


def test_sample_in_ranges_draws_in_proportion_within_the_ranges() -> None:
    capacity = 5000
    gen = torch.Generator().manual_seed(3)
    weights = torch.rand(capacity, generator=gen, dtype=torch.float64)
    weights[::3] = 0.0
    tree = SumTree(capacity)
    tree.rebuild(weights)
    ranges = [(4990, 5000), (0, 7)]  # a window across the end of the ring
    slots = tree.sample_in(200_000, ranges, torch.Generator().manual_seed(4))
    live = list(range(4990, 5000)) + list(range(7))
    counts = torch.bincount(slots, minlength=capacity)
    assert not counts[[s for s in range(capacity) if s not in live]].any()
    share = weights[live] / weights[live].sum()
    torch.testing.assert_close(counts[live].double() / slots.numel(), share, atol=4e-3, rtol=0.0)
    assert bool((weights[slots] > 0).all())


def test_find_in_ranges_covered_by_many_nodes() -> None:
    """A window across the ring end of a 3-level tree needs hundreds of covering nodes (several groups)."""
    capacity = 40_000
    gen = torch.Generator().manual_seed(5)
    weights = torch.randint(0, 4, (capacity,), generator=gen).double()
    ranges = [(8_037, 39_990), (0, 7_001)]
    tree = SumTree(capacity)
    tree.rebuild(weights)
    assert tree.cover(ranges)[0].numel() > 4 * tree.branching
    slots = torch.cat([torch.arange(lo, hi) for lo, hi in ranges])
    cumulative = weights[slots].cumsum(0)
    total = float(cumulative[-1])
    masses = torch.cat([torch.arange(0, total, 7.0), torch.rand(2000, generator=gen, dtype=torch.float64) * total])
    expected = slots[torch.searchsorted(cumulative, masses, right=True)]
    assert torch.equal(tree.find_in(masses, ranges), expected)
