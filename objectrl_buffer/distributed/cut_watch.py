"""What a remote buffer's handle knows of the coordinator's checkpoint cuts (issue 23: failing cuts are seen).

The coordinator takes cuts on its own (``checkpoint_every_s``) and counts the ones that fail
(:meth:`.coordinator.Coordinator.cut_status`). A handle must not let them fail silently, and must not slow each
write by a round trip to ask, so :class:`CutWatch` keeps one ``cut_status()`` call on its way, asked at most
once a second, and looks at its answer only once it has come (:meth:`CutWatch.check`, from every write and
sample). A failure not seen before is warned about in the driver (``RuntimeWarning``); once ``max_failed_cuts``
cuts failed in a row, the check raises :class:`~objectrl_buffer.errors.CheckpointError` until a cut succeeds.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from typing import Any

from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.errors import CheckpointError

__all__ = ["ASK_EVERY_S", "CutWatch"]

#: The least time between two ``cut_status()`` calls of :meth:`CutWatch.check`, in seconds.
ASK_EVERY_S = 1.0


class CutWatch:
    """The cut status one handle has seen, for the coordinator actor ``coordinator`` (thread-safe).

    Args:
        coordinator: the coordinator's Ray actor handle.
        max_failed_cuts: cuts failing in a row before :meth:`check` and :meth:`saw` raise.
    """

    def __init__(self, coordinator: Any, max_failed_cuts: int) -> None:
        self.coordinator, self.max_failed_cuts = coordinator, max_failed_cuts
        self._ref: Any = None  # a cut_status() call on its way
        self._asked = -math.inf  # when it was sent (time.monotonic())
        self._status: dict[str, Any] = {}  # the last status seen
        self._warned = 0  # failed cuts already warned about
        self._lock = threading.Lock()  # threads share a handle: one takes the answer, one asks again

    def check(self) -> None:
        """Look at the answer of the call on its way if it has come (never waiting for it), ask again if the last
        ask is over :data:`ASK_EVERY_S` old, warn about new failures, and raise once too many failed in a row.

        Raises:
            CheckpointError: see :meth:`saw`.
        """
        ray = _ray()
        with self._lock:
            ref = self._ref
            if ref is not None and ray.wait([ref], timeout=0)[0]:
                self._ref = None
                with contextlib.suppress(ray.exceptions.RayError):  # the coordinator is restarting: asked again later
                    self._status = ray.get(ref)
            if self._ref is None and time.monotonic() - self._asked >= ASK_EVERY_S:
                self._ref, self._asked = self.coordinator.cut_status.remote(), time.monotonic()
            self._saw(self._status)

    def saw(self, status: dict[str, Any]) -> None:
        """Take ``status``, a :meth:`.coordinator.Coordinator.cut_status` answer the caller fetched itself (the
        call on its way, if any, is dropped); warn and raise as :meth:`check`.

        Raises:
            CheckpointError: ``max_failed_cuts`` cuts failed in a row (the message names the last error and the
                last good cut's age).
        """
        with self._lock:
            self._ref, self._asked = None, time.monotonic()
            self._saw(status)

    def _saw(self, status: dict[str, Any]) -> None:
        self._status = status
        failed = int(status.get("failed_cuts", 0))
        if failed < self._warned:  # a restarted coordinator counts from 0
            self._warned = 0
        if failed > self._warned:
            self._warned = failed
            warnings.warn(
                f"remote buffer: {failed} checkpoint cut(s) failed ({status.get('failing')} in a row, last good cut "
                f"{_age(status.get('last_cut_age_s'))}): {status.get('last_error')}",
                RuntimeWarning,
                stacklevel=4,
            )
        if int(status.get("failing", 0)) >= self.max_failed_cuts:
            raise CheckpointError(
                f"remote buffer: the last {status.get('failing')} checkpoint cuts failed "
                f"({status.get('last_error')}; last good cut {_age(status.get('last_cut_age_s'))}): "
                "writes and samples are refused until a cut succeeds (handle.checkpoint())"
            )


def _age(seconds: float | None) -> str:
    return "none yet" if seconds is None else f"{seconds:.1f} s ago"
