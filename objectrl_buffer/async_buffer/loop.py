"""The asyncio event loop an :class:`~objectrl_buffer.async_buffer.buffer.AsyncSequenceBuffer` runs on.

The buffer's state is not locked: every change happens on one loop, between two awaits. A
:class:`LoopBinding` holds that loop and its ``asyncio.Condition``, wakes waiting consumers after
synchronous changes, and refuses calls that would change the state from a second loop or thread.

**Bound.** The buffer is bound to the loop of the latest ``put_batch`` / ``amend_batch`` / ``get_batch``
(the first such call binds it; construction binds nothing). It stays bound while that loop is running or a
call on it has not returned (a ``get_batch`` waiting on a stopped loop). An awaited call from another loop in
that time raises :class:`~objectrl_buffer.errors.ConcurrentUseError` and changes nothing. Once the loop is
closed (``asyncio.run`` returned), or stopped with no call of the buffer pending, the next loop that calls
takes the buffer over: sequential ``asyncio.run`` calls keep working.
"""

from __future__ import annotations

import asyncio
import threading

from objectrl_buffer.errors import ConcurrentUseError

__all__ = ["LoopBinding"]


class LoopBinding:
    """The loop the buffer is bound to, its Condition, the calls pending on it and the wake-up tasks.

    The binding itself is decided under a thread lock, so two loops starting at once cannot both take it.
    """

    def __init__(self, n_waits: int = 0) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cond: asyncio.Condition | None = None
        # One Condition per waiter kind (a consumer), on the lock of ``cond``: a change wakes only the
        # consumers it made ready, not every waiting task (issue 26: each wake-up is a task switch).
        self._n_waits = n_waits
        self.waits: list[asyncio.Condition] = []
        self._thread = ""  # the name of the thread that bound the loop, for messages
        self._calls = 0  # awaited calls entered on self.loop and not yet left
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def _holds(self, loop: asyncio.AbstractEventLoop) -> str | None:
        """Why the bound loop (not ``loop``) still holds the buffer, or None if ``loop`` may take it over."""
        bound = self.loop
        if bound is None or bound is loop or bound.is_closed():
            return None
        if bound.is_running():
            return f"is running in thread '{self._thread}'"
        if self._calls:
            return f"is stopped with {self._calls} call(s) of the buffer still pending on it"
        return None

    def enter(self, what: str) -> asyncio.Condition:
        """Start the awaited call ``what`` on the running loop: the Condition to use; pair with :meth:`leave`.

        Raises:
            ConcurrentUseError: the buffer is bound to another loop (see the module docstring); nothing changed.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.loop is not loop or self.cond is None:
                problem = self._holds(loop)
                if problem is not None:
                    raise ConcurrentUseError(
                        f"AsyncSequenceBuffer.{what} was awaited on an event loop of thread "
                        f"'{threading.current_thread().name}', but the buffer is bound to another event loop, "
                        f"which {problem}. One buffer serves one loop at a time: await it on that loop, or from "
                        "another thread call put_batch_threadsafe(...) (it runs the put there)"
                    )
                lock = asyncio.Lock()
                self.loop, self.cond, self._calls = loop, asyncio.Condition(lock), 0
                self.waits = [asyncio.Condition(lock) for _ in range(self._n_waits)]
                self._thread = threading.current_thread().name
            self._calls += 1
            return self.cond

    def leave(self, cond: asyncio.Condition) -> None:
        """End a call started by :meth:`enter` (which returned ``cond``)."""
        with self._lock:
            if self.cond is cond:  # else the binding moved on (this call's loop was closed meanwhile)
                self._calls -= 1

    async def _notify(self) -> None:
        cond = self.cond
        if cond is None or self.loop is not asyncio.get_running_loop():
            return  # the buffer moved to another loop: nobody waits on this one
        async with cond:
            cond.notify_all()
            for wait in self.waits:
                wait.notify_all()

    def check_thread(self, what: str) -> None:
        """Refuse a synchronous call from another thread while the buffer's loop runs (state is not locked).

        Raises:
            ConcurrentUseError: naming ``what`` and the way in from another thread.
        """
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            raise ConcurrentUseError(
                f"{what} was called from thread '{threading.current_thread().name}', not the one running the "
                f"buffer's event loop ('{self._thread}'); run it on that loop (from another thread: "
                "put_batch_threadsafe(...) for puts, loop.call_soon_threadsafe(...) for the rest)"
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
        """The loop a ``put_batch_threadsafe`` runs on: ``loop``, or the one the buffer is bound to.

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
