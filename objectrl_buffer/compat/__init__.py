"""Upstream names over our rooms: move from RLinf, AWorld or AReaL with import changes only.

One module per upstream, imported on its own (nothing here is loaded by ``import objectrl_buffer``):

- :mod:`objectrl_buffer.compat.rlinf`: RLinf's trajectory replay buffer (its ``Trajectory`` objects, nested
  ``dict`` samples, RLinf's counts and folder layout) over :mod:`objectrl_buffer.trajectory`;
- :mod:`objectrl_buffer.compat.aworld`: AWorld's replay buffer, storages and ``query_filter`` over
  :mod:`objectrl_buffer.tasks`;
- :mod:`objectrl_buffer.compat.areal`: AReaL's asynchronous buffer over :mod:`objectrl_buffer.async_buffer`.

Each keeps the upstream's call shapes and result types; where it differs on purpose the migration guide of that
upstream (``docs/migration/``) says so.
"""
