"""``python -m objectrl_buffer``: the ``objectrl-buffer`` command (see :mod:`objectrl_buffer.cli`)."""

from objectrl_buffer.cli import main

raise SystemExit(main())
