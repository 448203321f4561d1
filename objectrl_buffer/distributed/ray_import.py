"""Ray, imported on first use: the ``ray`` extra is optional, and the package imports without it."""

from __future__ import annotations

from typing import Any

__all__ = ["ray_module"]


def ray_module() -> Any:
    """The ``ray`` module.

    Raises:
        ImportError: Ray is not installed (the message says how to install it).
    """
    try:
        import ray
    except ImportError:
        raise ImportError(
            "objectrl_buffer.distributed.RemoteBuffer needs Ray: pip install 'objectrl_buffer[ray]'"
        ) from None
    return ray
