"""``python -m objectrl_buffer``: the ``objectrl-buffer`` command (see :mod:`objectrl_buffer.cli.commands`)."""

from objectrl_buffer.cli.commands import main

raise SystemExit(main())
