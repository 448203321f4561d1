"""The private torchrl/tensordict attributes we rely on still exist (an upgrade that removes one fails here,
naming it), and the adapter's functions do what the rest of the package expects of them."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RoundRobinWriter

from objectrl_buffer.storage import torchrl_compat


def test_every_private_attribute_we_use_is_still_there() -> None:
    missing = torchrl_compat.missing_internals()
    assert missing == [], f"this torchrl/tensordict lacks {missing}: update objectrl_buffer/storage/torchrl_compat.py"


def test_plain_items_is_the_tensordicts_own_mapping() -> None:
    td = TensorDict({"a": torch.zeros(3), "b": torch.ones(3)}, batch_size=[3])
    items = torchrl_compat.plain_items(td, 1)
    assert items is not None and set(items) == {"a", "b"} and items["b"] is td.get("b")
    assert torchrl_compat.plain_items(td, 0) is None  # other batch dims: not handled
    assert torchrl_compat.plain_items({"a": 1}, 0) is None


def test_drop_stored_returns_a_storage_to_its_lazy_state() -> None:
    storage = LazyTensorStorage(4)
    storage.set(0, TensorDict({"x": torch.ones(())}, batch_size=[]))
    assert torchrl_compat.stored_tensordict(storage) is not None
    torchrl_compat.drop_stored(storage)
    assert torchrl_compat.stored_tensordict(storage) is None and not storage.initialized and len(storage) == 0
    storage.set(0, TensorDict({"y": torch.zeros(2)}, batch_size=[]))  # a new schema allocates again
    stored = torchrl_compat.stored_tensordict(storage)
    assert stored is not None and set(stored.keys()) == {"y"}


def test_sync_view_sets_the_length_and_cursor_torchrl_reports() -> None:
    storage, writer = LazyTensorStorage(4), RoundRobinWriter()
    storage.set(0, TensorDict({"x": torch.ones(())}, batch_size=[]))
    torchrl_compat.sync_view(storage, writer, 3, 2)
    assert len(storage) == 3


def test_new_tensordict_keeps_the_given_tensors() -> None:
    x = torch.arange(4)
    td = torchrl_compat.new_tensordict({"x": x}, torch.Size([4]), None)
    assert td.batch_size == torch.Size([4]) and td.get("x") is x
