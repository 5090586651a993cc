"""Waiting for an object to reach a state: a GET, then a watch from its resourceVersion,
opened again when the server ends it, it breaks, or the server refuses it for a while (429,
5xx), until a decision or the deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from ._kube import Kube
from .errors import ApiError, TransportError

#: Decides on the object as seen (``None``: deleted): ``True`` done, ``False`` keep waiting;
#: raises to stop with an error.
Decide = Callable[[Mapping[str, Any] | None], bool]


async def watch_until(
    kube: Kube, collection: str, name: str, decide: Decide, timeout: float
) -> dict[str, Any] | None:
    """The object once ``decide`` says done, or ``None`` when ``timeout`` passed first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        try:
            obj = await kube.get_opt(f"{collection}/{name}")
            if decide(obj):
                return obj
            assert obj is not None  # decide(None) raises or returns True
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            query = {"fieldSelector": f"metadata.name={name}", "resourceVersion": rv}
            try:
                async for ev in kube.watch(collection, query=query, timeout=remaining):
                    kind, o = ev.get("type"), ev.get("object")
                    if kind == "ERROR":
                        break  # e.g. 410 Gone: read the object again
                    if kind == "DELETED":
                        if decide(None):
                            return None
                    elif kind in ("ADDED", "MODIFIED") and isinstance(o, dict) and decide(o):
                        return o
            except TransportError:
                # A loaded API server drops watches: read again and watch anew.
                await asyncio.sleep(0.2)
        except ApiError as e:
            if not transient(e):
                raise
            # The API server asks to come back (429 while a CRD's storage is re-initialised
            # after a CRD update; 5xx while it is overloaded): read again and watch anew.
            await asyncio.sleep(min(RETRY_PAUSE, max(0.0, deadline - loop.time())))


#: How long to pause before reading again after a transient refusal.
RETRY_PAUSE = 1.0


def transient(err: ApiError) -> bool:
    """Whether the API server's refusal passes by itself: 429 Too Many Requests (also sent
    while a custom resource's storage is re-initialised) or a 5xx.
    """
    return err.status == 429 or err.status >= 500


async def wait_gone(kube: Kube, path: str, timeout: float) -> bool:
    """Polls until the object at ``path`` is gone (its finalizers done); ``False`` when it
    still exists after ``timeout``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await kube.get_opt(path) is not None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.2)
    return True
