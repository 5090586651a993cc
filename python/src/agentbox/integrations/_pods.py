"""What both framework backends need from a sandbox beyond the SDK's calls: running an
operation again, once, after the sandbox's pod was replaced under it; and ending a run's use
of a sandbox (suspend or delete) under the scope's guard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from ..client import Sandbox
from ..errors import (
    CommandNotStartedError,
    GuardTimeoutError,
    NotFoundError,
    RemoteFileNotFoundError,
)

T = TypeVar("T")


def pod_was_missing(err: BaseException) -> bool:
    """Whether an error says the command never reached a container: the pod is gone
    (``NotFoundError`` on the exec handshake) or its container is (``CommandNotStartedError``
    from the runtime). A missing workspace *file* is not such an error.
    """
    if isinstance(err, RemoteFileNotFoundError):
        return False
    return isinstance(err, (CommandNotStartedError, NotFoundError))


async def in_pod(sandbox: Sandbox, op: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Runs ``op``; when it could not start because the pod went away (deleted, evicted, its
    sandbox suspended), waits until the sandbox serves in a new pod (:meth:`Sandbox.recover`)
    and runs it once more. The retry is safe: the first attempt never started.
    """
    try:
        return await op()
    except (CommandNotStartedError, NotFoundError) as err:
        if not pod_was_missing(err):
            raise
        before = sandbox.pod_name, (sandbox.status.get("workspace") or {}).get("initializedPodUid")
        await sandbox.recover(timeout)
        after = sandbox.pod_name, (sandbox.status.get("workspace") or {}).get("initializedPodUid")
        if before == after and isinstance(err, CommandNotStartedError):
            raise  # the same pod serves: the program itself could not start
        return await op()


async def stop_unless_busy(
    sandbox: Sandbox, how: Literal["suspend", "delete"], timeout: float
) -> bool:
    """Suspends or deletes the sandbox at the end of a run, under the scope's guard: taken
    without waiting, and the stop handed over under it, so the pod never goes under another
    run of the scope. When another run holds the guard, it is at work in this sandbox: it is
    left to that run (whose own end stops it) and False is returned.
    """
    guard = sandbox.guard(wait=0)
    try:
        await guard.acquire()
    except GuardTimeoutError:
        return False
    try:
        if how == "suspend":
            await sandbox.suspend(guard=guard, timeout=timeout)
        else:
            await sandbox.delete(wait=True, timeout=timeout)
    except NotFoundError:
        pass
    finally:
        await guard.release()
    return True
