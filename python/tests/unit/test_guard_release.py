"""The guard's release against a fake API server: a renewal in flight when the guarded block
ends is finished, not abandoned, so the release's conditioned update carries the
resourceVersion that renewal produced (abandoned, the release failed with a 409 as if someone
had taken the lease: seen under load in the integration tests)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agentbox._kube import Kube
from agentbox.errors import ConflictError
from agentbox.guard import Guard, GuardConfig


class SlowRenewals:
    """A lease store whose updates apply at once but answer only when let go."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.renewing = asyncio.Event()
        self.answer = asyncio.Event()
        self.released: dict[str, Any] | None = None

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        return self.lease

    async def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "POST":
            return self._store(body)
        if body["metadata"]["resourceVersion"] != str(self.rv):
            raise ConflictError(409, "Conflict", "the object has been modified")
        if body["spec"].get("holderIdentity") is None:
            self.released = self._store(body)
            return self.released
        # A renewal: applied now, answered later.
        stored = self._store(body)
        self.renewing.set()
        await self.answer.wait()
        return stored

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        lease = {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": str(self.rv)}}
        self.lease = lease
        return lease


async def test_a_release_during_a_renewal_waits_for_it_and_then_succeeds() -> None:
    api = SlowRenewals()

    async def kube() -> Kube:
        return cast(Kube, api)

    cfg = GuardConfig(lease_duration=3.0, renew_interval=0.05)
    guard = Guard(kube, "team", "agentbox-guard-x", {}, cfg, wait=1.0)
    await guard.acquire()
    await asyncio.wait_for(api.renewing.wait(), 5)
    release = asyncio.ensure_future(guard.release())
    await asyncio.sleep(0.1)
    assert not release.done(), "the release went ahead of the renewal in flight"
    api.answer.set()
    await asyncio.wait_for(release, 5)
    assert api.released is not None
    assert api.released["spec"].get("holderIdentity") is None
