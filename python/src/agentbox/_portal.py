"""The event loop behind the sync API: one daemon thread per process runs it, and sync calls
hand their coroutine to it and wait. So the sync API is the async core, not a second
implementation, and works from any thread (also one that runs its own event loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TypeVar

from .errors import AgentboxError, GuardLostError
from .guard import Guard

_T = TypeVar("_T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_local = threading.local()


def loop() -> asyncio.AbstractEventLoop:
    """The portal's loop, started on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            t = threading.Thread(target=new.run_forever, name="agentbox-sync", daemon=True)
            t.start()
            _loop, _thread = new, t
        return _loop


def active_guards() -> list[Guard]:
    """The sync guards this thread holds (innermost last)."""
    guards: list[Guard] | None = getattr(_local, "guards", None)
    if guards is None:
        guards = []
        _local.guards = guards
    return guards


async def _under_guards(aw: Awaitable[_T], guards: Sequence[Guard]) -> _T:
    """Runs ``aw``, cancelled with :class:`GuardLostError` if one of ``guards`` is lost."""
    try:
        for g in guards:
            g.check()
    except GuardLostError:
        if isinstance(aw, Coroutine):
            aw.close()  # never started
        raise
    task = asyncio.ensure_future(aw)
    if not guards:
        return await task
    watchers = [asyncio.ensure_future(g.wait_lost()) for g in guards]
    try:
        await asyncio.wait([task, *watchers], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in watchers:
            w.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for g in guards:
            g.check()
        raise GuardLostError(guards[-1].lease_name)
    return task.result()


def call(aw: Awaitable[_T], *, guarded: bool = True) -> _T:
    """Runs ``aw`` on the portal's loop and returns its result. Inside a sync guard block,
    the call is cancelled and :class:`GuardLostError` raised when the guard is lost.
    """
    lp = loop()
    if threading.current_thread() is _thread:
        if isinstance(aw, Coroutine):
            aw.close()
        raise AgentboxError(
            "agentbox.sync called from its own event loop thread; use the async API there"
        )
    # A guard released by hand inside its block no longer guards the calls after it.
    guards = [g for g in active_guards() if not g.released] if guarded else []
    fut: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(
        _under_guards(aw, guards), lp
    )
    try:
        return fut.result()
    except BaseException:
        # KeyboardInterrupt or the like: stop the work on the loop too.
        fut.cancel()
        raise
