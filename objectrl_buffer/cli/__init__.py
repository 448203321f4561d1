"""The ``objectrl-buffer`` command (see :mod:`.main`)."""

from objectrl_buffer.cli.commands import main

__all__ = ["main"]
