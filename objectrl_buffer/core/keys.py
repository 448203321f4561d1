"""Reserved key names: what samples carry besides the stored keys. A write may never store them.

* ``index``: the storage slot of each sampled row (int64), as ObjectRL's buffer returns it. A write
  that carries it (a sample written back) has it dropped, never stored.
* ``weight``: importance weights of a prioritized sample (float32).
* ``mask``: ``False`` on the padding of a padded slice (bool).
* ``discount``: ``gamma ** steps`` of an n-step sample (float32).
* ``present``: in a trajectory sample, for each stored key some trajectory lacked, whether the row's
  trajectory held it (bool), nested like the key (``("present", "versions")``); the rows it lacked hold 0.
* ``generation``: which write of each sampled slot was drawn (int64), in samples of a buffer shared across
  processes or served by Ray; ``update_priority(..., generation)`` skips the slots rewritten since.
"""

from __future__ import annotations

__all__ = ["INDEX_KEY", "WEIGHT_KEY", "MASK_KEY", "DISCOUNT_KEY", "GENERATION_KEY", "PRESENT_KEY", "RESERVED_KEYS"]

INDEX_KEY = "index"
WEIGHT_KEY = "weight"
MASK_KEY = "mask"
DISCOUNT_KEY = "discount"
GENERATION_KEY = "generation"
PRESENT_KEY = "present"

#: Every key a sample may add to the stored ones.
RESERVED_KEYS = frozenset({INDEX_KEY, WEIGHT_KEY, MASK_KEY, DISCOUNT_KEY, GENERATION_KEY, PRESENT_KEY})
