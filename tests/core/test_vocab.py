"""core/vocab.py: codes in first-seen order, None is -1, lookups never add, a rebuilt vocabulary keeps codes."""

from __future__ import annotations

import pytest

from objectrl_buffer.core.vocab import NULL, Vocab


def test_codes_lookup_and_rebuild() -> None:
    v = Vocab()
    assert [v.code(s) for s in ["b", "a", "b", None]] == [0, 1, 0, NULL]
    assert v.find("c") is None and len(v) == 2 and v.find(3) is None and v.find(None) == NULL
    assert v.string(1) == "a" and v.string(NULL) is None
    assert v.codes_where(lambda s: s.startswith("a")).tolist() == [1]
    again = Vocab(v.strings)
    assert [again.find(s) for s in ["b", "a"]] == [0, 1]
    with pytest.raises(ValueError, match="twice"):
        Vocab(["a", "a"])
    with pytest.raises(TypeError):
        Vocab([1])  # type: ignore[list-item]


def test_member_mask_equals_isin() -> None:
    import torch

    v = Vocab(["a", "b", "c"])
    column = torch.tensor([0, -1, 2, 1, 2, -1])
    assert v.member_mask(column, [2, -1]).tolist() == [False, True, True, False, True, True]
    assert v.member_mask(column, []).tolist() == [False] * 6
    assert v.member_mask(column, [0, 1]).tolist() == torch.isin(column, torch.tensor([0, 1])).tolist()


def test_batch_codes_equal_one_by_one() -> None:
    one, batch = Vocab(["x"]), Vocab(["x"])
    strings = ["b", None, "a", "b", "x", None, "c", "a"]
    assert batch.codes(strings) == [one.code(s) for s in strings]
    assert batch.strings == one.strings and batch.codes([]) == []
