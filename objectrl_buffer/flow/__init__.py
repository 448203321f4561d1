"""Flow control between writers and samplers: Reverb's samples-per-insert rate limiters.

``RateLimiter`` (and ``SampleToInsertRatio``, ``MinSize``, ``Queue``) admit inserts and samples so that the
replay ratio holds; ``limited(buffer, limiter)`` gates a buffer's ``add``/``add_batch``/``sample_batch``.
"""

from objectrl_buffer.flow.factories import MinSize, Queue, SampleToInsertRatio
from objectrl_buffer.flow.limited import LimitedBuffer, limited
from objectrl_buffer.flow.limiter import RateLimiter

__all__ = ["RateLimiter", "SampleToInsertRatio", "MinSize", "Queue", "LimitedBuffer", "limited"]
