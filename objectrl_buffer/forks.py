"""A CPU buffer and child processes: shared when handed over, read-only when merely inherited through ``fork``.

A CPU buffer's rows live in ``MAP_SHARED`` files (torchrl memmaps), and ``fork`` copies only its counters: a
fork child writing into a buffer that was not shared before the fork would overwrite the parent's rows behind
the parent's counters (and the parent's later writes would overwrite the child's). So:

* **Handed over, it is shared.** ``multiprocessing``'s pickler (``Process`` arguments under ``spawn`` and
  ``forkserver``; ``Queue``, ``Pipe`` and ``Pool`` under every start method) shares it through
  :func:`reduce_for_process`. Under ``fork``, ``Process`` arguments are not pickled: just before each
  ``fork`` (``os.register_at_fork(before=...)``) the buffers the forking ``Process`` holds are shared: its
  target's ``args``/``kwargs`` (up to three containers deep: ``torch.multiprocessing.start_processes``
  nests them, a ``Pool``'s ``initargs`` too), a bound target's object and its attributes
  (``target=worker.run``), and the attributes of a ``Process`` subclass; the library's own wrappers are seen
  through (see :data:`HOLDS`: :func:`~objectrl_buffer.flow.limited`'s buffer and limiter, as
  ``multiprocessing``'s pickler reaches them under ``spawn``). Sharing copies the rows into
  ``/dev/shm`` once (O(rows)) and switches the parent to the shared write path
  (:mod:`objectrl_buffer.distributed.process`); a buffer's rate limiter shares its counters with it, and so
  does a bare :class:`~objectrl_buffer.flow.RateLimiter` the ``Process`` holds (as its pickle would).
* **Merely inherited, it is read-only.** Every other live buffer (the forks a user does not think of:
  DataLoader workers, gymnasium's ``AsyncVectorEnv``, a library's helper process) is made read-only in the
  child at the fork itself: its writes raise :class:`~objectrl_buffer.errors.ForkedBufferError`, reads see
  the parent's rows, ``close`` leaves the parent's files alone. Sharing every buffer before every fork
  would make those forks pay the O(rows) copy and switch the parent to the slower shared path for the rest
  of its run (``benchmarks/fork_share_bench.py``).

A buffer that cannot be shared at the fork (no schema yet, ``/dev/shm`` full, ...) is left unshared (an
exception cannot stop a fork from an at-fork hook): the parent gets a ``RuntimeWarning`` naming the reason,
and the child's refusal repeats it.

The forking ``Process`` is found on the call stack of ``os.fork`` (``multiprocessing``'s ``Popen`` keeps it
as a local); an ``os.fork`` called directly hands nothing over.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
import weakref
from types import FrameType, MethodType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objectrl_buffer.replay_buffer import ReplayBuffer

__all__ = ["track_for_fork", "reduce_for_process", "HOLDS"]

#: The method a wrapper of this library defines to list what it holds (``() -> Iterable``: e.g.
#: :class:`~objectrl_buffer.flow.LimitedBuffer` gives its buffer and its limiter). A wrapper found among a
#: forking ``Process``'s values is seen through (it takes no level of the depth limit): what it lists is looked
#: at as if handed over itself, so the buffers and limiters inside are shared as the pickler shares them under
#: ``spawn``. Only a method defined on the value's class counts (an instance's ``__getattr__`` is never asked);
#: other objects are not walked beyond what the module docs list.
HOLDS = "__objectrl_holds__"

#: Every live CPU buffer of this process that may own memory-mapped rows (weakly: tracking keeps none alive).
_LIVE: weakref.WeakSet[ReplayBuffer] = weakref.WeakSet()
#: In a fork child, the buffers it inherited: kept alive so that collecting them never removes the parent's files.
_INHERITED: list[ReplayBuffer] = []
#: What a fork child may not call on an inherited buffer (``extend`` goes through ``add_batch``).
_WRITES = ("add", "add_batch", "reset", "load", "load_state_dict")
#: How far a handed-over buffer may sit inside the ``Process``'s values, and how many values are looked at.
_DEPTH, _BUDGET = 3, 10_000


def track_for_fork(rb: ReplayBuffer) -> None:
    """Guard ``rb`` against writes from the fork children of this process (CPU storage only: only memory-mapped
    rows outlive a fork as shared memory); called by the buffer's constructor."""
    if rb.storing_device.type == "cpu":
        _LIVE.add(rb)


def reduce_for_process(rb: ReplayBuffer) -> tuple[Any, ...]:
    """``multiprocessing``'s pickler only: share ``rb``'s rows with the child
    (:mod:`objectrl_buffer.distributed.process`).

    Raises:
        ForkedBufferError: ``rb`` was inherited through ``fork`` unshared (share it in the parent instead).
    """
    if "forked_from" in rb.__dict__:
        _refuse(rb, "handing it to another process")
    from objectrl_buffer.distributed.process import reduce_for_process as share_rows

    return share_rows(rb)


# ---------------------------------------------------------------------- in the parent, just before a fork
def _forking_process() -> Any:
    """The ``multiprocessing`` ``Process`` whose ``start`` is forking now, if any (from the caller frames)."""
    from multiprocessing.process import BaseProcess

    frame: FrameType | None = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            break
        local = frame.f_locals
        # Popen(process_obj)._launch, or BaseProcess.start itself; not ``self`` of a running Process's
        # ``run``: an os.fork inside a child's run hands nothing over
        for name in ("process_obj", "self") if frame.f_code.co_name in ("_launch", "start") else ():
            if isinstance(local.get(name), BaseProcess):
                return local[name]
        frame = frame.f_back
    return None


def _handed_over(process: Any, candidates: list[Any]) -> list[Any]:
    """The ``candidates`` (live buffers, unshared rate limiters) among the values ``process`` holds (see the
    module docs), each once."""
    live = {id(obj): obj for obj in candidates}
    found: dict[int, Any] = {}
    stack = [(value, 0) for value in vars(process).values()]
    budget = _BUDGET
    while stack and budget:
        value, depth = stack.pop()
        budget -= 1
        if id(value) in live:
            found[id(value)] = value
        elif callable(getattr(type(value), HOLDS, None)):  # a library wrapper: what it holds, at its depth
            stack.extend((item, depth) for item in getattr(value, HOLDS)())
        elif depth < _DEPTH:
            if isinstance(value, dict):
                stack.extend((item, depth + 1) for item in value.values())
            elif isinstance(value, (tuple, list, set, frozenset)):
                stack.extend((item, depth + 1) for item in value)
            elif isinstance(value, MethodType):  # target=worker.run: the worker and what it holds
                owner = value.__self__
                stack.append((owner, depth + 1))
                stack.extend((item, depth + 1) for item in getattr(owner, "__dict__", {}).values())
            elif isinstance(value, functools.partial):
                stack.extend((item, depth + 1) for item in (*value.args, *value.keywords.values()))
    return list(found.values())


def _unshared_limiters() -> list[Any]:
    """This process's rate limiters whose counters are not shared yet (none if ``flow`` was never imported)."""
    module = sys.modules.get("objectrl_buffer.flow.limiter")
    return [] if module is None else module.unshared()


def _share_handed_over() -> None:
    limiters = _unshared_limiters()
    if not _LIVE and not limiters:
        return  # the usual fork: no buffer or rate limiter in this process
    process = _forking_process()
    if process is None:
        return
    found = _handed_over(process, [*_LIVE, *limiters])
    bare = {id(limiter) for limiter in limiters}
    failed, unshared = [], []
    for limiter in (obj for obj in found if id(obj) in bare):  # as its pickle does: the child shares the counters
        try:
            limiter.share()
        except Exception as exc:
            unshared.append(f"{type(limiter).__name__} ({type(exc).__name__}: {exc})")
    for rb in (obj for obj in found if id(obj) not in bare):
        if "shared" in rb.__dict__ or "forked_from" in rb.__dict__ or rb.engine.storage.closed:
            continue
        from objectrl_buffer.distributed.process import become_shared  # a buffer's rate limiter goes with it

        rb.__dict__.pop("share_failed", None)
        try:
            become_shared(rb)
        except Exception as exc:  # an at-fork hook cannot stop the fork: tell both sides
            reason = rb.__dict__["share_failed"] = f"{type(exc).__name__}: {exc}"
            failed.append(f"{type(rb).__name__} ({reason})")
    if failed:  # after every buffer had its chance (a warning turned into an error ends the hook)
        warnings.warn(
            f"handed to a fork child but could not be shared: {'; '.join(failed)}; the child may read them but "
            "their writes raise ForkedBufferError",
            RuntimeWarning,
            stacklevel=2,
        )
    if unshared:
        warnings.warn(
            f"rate limiters handed to a fork child but whose counters could not be shared: {'; '.join(unshared)}; "
            "the child counts on its own copy",
            RuntimeWarning,
            stacklevel=2,
        )


# ---------------------------------------------------------------------- in the child, just after a fork
def _refuse(rb: ReplayBuffer, what: str) -> None:
    from objectrl_buffer.errors import ForkedBufferError

    failed = rb.__dict__.get("share_failed")
    why = f" (sharing it at the fork failed: {failed})" if failed else ""
    raise ForkedBufferError(
        f"{type(rb).__name__}: {what} refused: this process (pid {os.getpid()}) inherited the buffer through "
        f"fork from pid {rb.__dict__['forked_from']} without it being shared{why}, so its rows are the parent's "
        "memory-mapped files while its counters are this process's own copy: a write here would overwrite the "
        "parent's rows behind its back. Reads still work. To write from child processes, share it with them: "
        "pass it as a Process argument (any start method), through a multiprocessing Queue or Pipe, or call "
        "objectrl_buffer.distributed.become_shared(buffer) in the parent before forking"
    )


def _guard(rb: ReplayBuffer, parent: int) -> None:
    def refusal(name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> None:
            _refuse(rb, name)

        return refuse

    rb.__dict__["forked_from"] = parent
    for name in _WRITES:
        rb.__dict__[name] = refusal(name)  # shadows the class's method (and a rate limiter's gate)
    rb.__dict__["close"] = _leave_files  # the parent owns the files: closing here must not remove them
    _INHERITED.append(rb)


def _leave_files() -> None:
    """``close()`` of a buffer inherited through fork: nothing to free here (the parent owns the files)."""


def _guard_inherited() -> None:
    parent = os.getppid()
    for rb in list(_LIVE):
        if "shared" in rb.__dict__ or "forked_from" in rb.__dict__ or rb.engine.storage.closed:
            continue  # shared before the fork (its writes are safe), already guarded, or closed
        _guard(rb, parent)
    _LIVE.clear()  # the inherited buffers are this process's no more (buffers made from now on are)


os.register_at_fork(before=_share_handed_over, after_in_child=_guard_inherited)
