"""The asyncio event loop an :class:`~objectrl_buffer.async_buffer.buffer.AsyncSequenceBuffer` runs on.

The buffer's state is not locked: every change happens on one loop, between two awaits. A
:class:`LoopBinding` holds that loop and its ``asyncio.Condition`` (rebound when the buffer is used from a
new loop), wakes waiting consumers after synchronous changes, and refuses calls from other threads.
"""

from __future__ import annotations

import asyncio

__all__ = ["LoopBinding"]


class LoopBinding:
    """The loop the buffer last ran on, its Condition, and the wake-up tasks still pending."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def condition(self) -> asyncio.Condition:
        """The Condition of the running loop (a buffer used from a new loop, e.g. after asyncio.run, rebinds)."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop or self.cond is None:
            self.loop, self.cond = loop, asyncio.Condition()
        return self.cond

    async def _notify(self) -> None:
        cond = self.condition()
        async with cond:
            cond.notify_all()

    def check_thread(self, what: str) -> None:
        """Refuse a synchronous call from another thread while the buffer's loop runs (state is not locked)."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            raise RuntimeError(
                f"{what} was called from a thread other than the one running the buffer's event loop; "
                "use put_batch_threadsafe(...) there"
            )

    def wake_soon(self) -> None:
        """Wake the waiting consumers after a synchronous change (runs on the buffer's loop)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return  # no loop ever ran get_batch: nobody waits
        if loop.is_running():
            task = loop.create_task(self._notify())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            loop.call_soon_threadsafe(self.wake_soon)

    def threadsafe_target(self, loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
        """The loop a ``put_batch_threadsafe`` runs on: ``loop``, or the one the buffer last ran on.

        Raises:
            RuntimeError: no such loop, or called on that very loop (waiting would block it).
        """
        target = loop or self.loop
        if target is None or target.is_closed():
            raise RuntimeError("put_batch_threadsafe: the buffer has no running event loop yet; pass loop=")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is target:
            raise RuntimeError(
                "put_batch_threadsafe called on the buffer's own loop (it would block it): await put_batch"
            )
        return target
