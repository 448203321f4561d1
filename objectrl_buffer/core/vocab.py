"""Strings <-> dense integer codes, so string columns can live in integer tensors and compare with ``==``/``isin``.

Codes are handed out in first-seen order (0, 1, 2, ...) and never reused, so a code stays valid for the
life of the vocabulary even after the rows that used it are gone. ``None`` is code :data:`NULL` (-1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["NULL", "Vocab"]

NULL = -1
"""The code of ``None`` (a missing string)."""


class Vocab:
    """An append-only interning table: :meth:`code` adds, :meth:`find` only looks up."""

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._codes: dict[str, int] = {}
        self._strings: list[str] = []
        for s in strings:
            if not isinstance(s, str):
                raise TypeError(f"a vocabulary holds str, got {type(s).__name__}")
            if s in self._codes:
                raise ValueError(f"string {s!r} appears twice in the vocabulary")
            self.code(s)

    def __len__(self) -> int:
        return len(self._strings)

    def __contains__(self, s: object) -> bool:
        return s in self._codes

    def code(self, s: str | None) -> int:
        """The code of ``s``, added if new (``None`` -> :data:`NULL`)."""
        if s is None:
            return NULL
        found = self._codes.get(s)
        if found is None:
            found = self._codes[s] = len(self._strings)
            self._strings.append(s)
        return found

    def codes(self, strings: Sequence[str | None]) -> list[int]:
        """``[self.code(s) for s in strings]``, each distinct string looked up once (a batch of rows repeats
        few strings, so this is one dict lookup per entry instead of a method call)."""
        known: dict[str | None, int] = {None: NULL}
        for s in dict.fromkeys(strings):
            if s is not None:
                known[s] = self.code(s)
        return [known[s] for s in strings]

    def find(self, s: object) -> int | None:
        """The code of ``s`` without adding it; ``None`` for a string never seen (or a non-string)."""
        if s is None:
            return NULL
        return self._codes.get(s) if isinstance(s, str) else None

    def string(self, code: int) -> str | None:
        """The string of ``code`` (``NULL`` -> ``None``)."""
        return None if code == NULL else self._strings[code]

    def codes_where(self, predicate: object) -> torch.Tensor:
        """int64 ``[k]``, CPU: the codes of the strings for which ``predicate(s)`` is true (a scan of the
        vocabulary, not of the rows: what ``LIKE`` compiles to before an ``isin`` over a column)."""
        assert callable(predicate)
        return torch.tensor([i for i, s in enumerate(self._strings) if predicate(s)], dtype=torch.int64)

    def member_mask(self, column: torch.Tensor, codes: list[int]) -> torch.Tensor:
        """bool like ``column`` (int64 codes of this vocabulary, -1 for None): which entries are in ``codes``.

        A lookup table over the vocabulary gathered by the column: one pass over the rows whatever the number
        of ``codes`` (``torch.isin`` compares every row with every code, or sorts)."""
        table = torch.zeros(len(self._strings) + 1, dtype=torch.bool)  # slot 0 is NULL
        if codes:
            table[torch.tensor(codes, dtype=torch.int64) + 1] = True
        return table[column + 1]

    @property
    def strings(self) -> list[str]:
        """Every string, in code order (a copy): ``Vocab(v.strings)`` rebuilds the same codes."""
        return list(self._strings)
