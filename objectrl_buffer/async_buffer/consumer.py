"""Who reads an asynchronous buffer: a named consumer (a trainer RPC) with the keys it needs and its batch size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["Consumer", "as_consumers"]

#: The key every sample carries: its unique integer id, returned with every batch.
IDS = "ids"


@dataclass(frozen=True)
class Consumer:
    """A reader of :class:`AsyncSequenceBuffer`: ``get_batch`` gives it ``n_seqs`` entries holding ``input_keys``.

    Any object with ``name``, ``input_keys`` and ``n_seqs`` attributes (AReaL's ``MFCDef``) is accepted
    by the buffer in its place.
    """

    name: str
    input_keys: tuple[str, ...]
    n_seqs: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"Consumer name must be a non-empty str, got {self.name!r}")
        keys = self.input_keys
        if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
            raise InvalidArgumentError(
                f"Consumer '{self.name}': input_keys must be a sequence of non-empty str, got {keys!r}"
            )
        if len(set(keys)) != len(tuple(keys)):
            raise InvalidArgumentError(f"Consumer '{self.name}': input_keys has duplicates: {list(keys)}")
        object.__setattr__(self, "input_keys", tuple(keys))
        object.__setattr__(self, "n_seqs", positive_int(self.n_seqs, f"Consumer '{self.name}' n_seqs"))


def as_consumers(consumers: Sequence[Any]) -> tuple[Consumer, ...]:
    """``consumers`` (Consumer or any object with ``name``, ``input_keys``, ``n_seqs``) as checked Consumers.

    Raises:
        InvalidArgumentError: none given, an attribute missing or invalid, or two share a name.
    """
    if isinstance(consumers, (str, bytes)) or not isinstance(consumers, Sequence) or not consumers:
        raise InvalidArgumentError(f"consumers must be a non-empty sequence of Consumer, got {consumers!r}")
    out = []
    for c in consumers:
        if isinstance(c, Consumer):
            out.append(c)
            continue
        try:
            out.append(Consumer(c.name, tuple(c.input_keys), c.n_seqs))
        except AttributeError as exc:
            raise InvalidArgumentError(
                f"consumers: {c!r} has no {exc.name or 'name/input_keys/n_seqs'} attribute"
            ) from None
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"consumers: names must be unique, {twice} appear more than once")
    return tuple(out)
