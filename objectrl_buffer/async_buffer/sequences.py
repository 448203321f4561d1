"""Several sequences under one key of one sample, or only their lengths (AReaL's packed ``SequenceSample``).

A sample's key usually holds one tensor: one sequence. :class:`Sequences` holds ``k`` sequences packed along
the first dimension (``data.shape[0] == sum(seqlens)``), e.g. a prompt's group of 3 responses of 2, 3 and
4 tokens (``seqlens [2, 3, 4]``), or only their lengths (``data=None``): a metadata-only entry, as AReaL's
master puts while the workers hold the tensors. A jagged nested tensor given as a sample's value means the
same (its components are the sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from objectrl_buffer.core.schema import without_data
from objectrl_buffer.errors import SchemaError

__all__ = ["Sequences", "SEQLENS"]

#: The sub-TensorDict of a batch that holds the lengths of every :class:`Sequences` key the consumer reads.
SEQLENS = "seqlens"


@dataclass(frozen=True, init=False)
class Sequences:
    """``len(seqlens)`` sequences of one key of one sample, packed in ``data`` (or only their lengths).

    Args:
        seqlens: the length of each sequence (non-negative ints; at least one).
        data: the sequences concatenated along dim 0 (``[sum(seqlens), *trailing]``, on any device), or
            ``None`` for a metadata-only key: the buffer tracks its presence and lengths, not its values.

    Raises:
        SchemaError: lengths that are not non-negative ints, ``data`` of another total length, a 0-d
            ``data``, or a tensor without strided data.

    A buffer returns such a key of a batch as today's variable-length keys (``batch[key]``: each entry's
    packed data, stacked or jagged) plus ``batch["seqlens", key]``: each entry's lengths, int64 ``[n, k]``
    (jagged ``[n, j]`` when entries hold different numbers of sequences). A metadata-only key gives only
    ``batch["seqlens", key]``.
    """

    seqlens: tuple[int, ...]
    data: torch.Tensor | None

    def __init__(self, seqlens: Sequence[int] | torch.Tensor, data: torch.Tensor | None = None) -> None:
        if isinstance(seqlens, torch.Tensor):
            seqlens = seqlens.tolist()
        if isinstance(seqlens, (str, bytes)) or not isinstance(seqlens, Sequence):
            raise SchemaError(f"Sequences: seqlens must be a sequence of ints, got {seqlens!r}")
        lengths = tuple(seqlens)
        if not lengths or not all(type(n) is int and n >= 0 for n in lengths):
            raise SchemaError(f"Sequences: seqlens must be one or more non-negative ints, got {list(seqlens)!r}")
        if data is not None:
            if not isinstance(data, torch.Tensor) or data.is_nested:
                raise SchemaError(f"Sequences: data must be a tensor (packed along dim 0), got {type(data).__name__}")
            problem = without_data(data)
            if problem is not None:
                raise SchemaError(f"Sequences: a data tensor {problem} cannot be stored")
            if data.dim() == 0 or data.shape[0] != sum(lengths):
                raise SchemaError(
                    f"Sequences: data of shape {list(data.shape)} does not hold seqlens {list(lengths)} "
                    f"(sum {sum(lengths)}) packed along dim 0"
                )
        object.__setattr__(self, "seqlens", lengths)
        object.__setattr__(self, "data", data)

    @staticmethod
    def from_nested(value: torch.Tensor) -> Sequences:
        """The components of a nested tensor as sequences (their first dims are the lengths)."""
        parts = value.detach().unbind()
        if not parts or parts[0].dim() == 0:
            raise SchemaError("Sequences: a nested tensor without (sequence) components holds no sequence")
        return Sequences([p.shape[0] for p in parts], torch.cat(parts))

    def to(self, device: torch.device) -> Sequences:
        """The same lengths with ``data`` on ``device`` (detached; the same object when nothing moves)."""
        if self.data is None or (self.data.device == device and not self.data.requires_grad):
            return self
        return Sequences(self.seqlens, self.data.detach().to(device))
