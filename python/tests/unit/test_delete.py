"""``Sandbox.delete(wait=True)`` against a fake API server whose Sandbox never goes: the
timeout is its own error, not a readiness one."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agentbox import Sandboxes, SandboxNotDeletedError, SandboxNotReadyError
from agentbox._kube import Kube


class StuckSandbox:
    """A Sandbox whose finalizer never goes: DELETE is accepted, GET finds it still."""

    def __init__(self) -> None:
        self.deleted = False

    async def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        assert method == "DELETE", method
        self.deleted = True
        return {}

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        return {"metadata": {"name": "s", "deletionTimestamp": "2026-01-01T00:00:00Z"}}


async def test_a_delete_that_waits_in_vain_raises_not_deleted() -> None:
    api = StuckSandbox()
    sandboxes = Sandboxes("team", api_client=object())
    sandboxes._kube = cast(Kube, api)
    sbx = sandboxes._handle({"metadata": {"name": "s"}})
    with pytest.raises(SandboxNotDeletedError) as e:
        await sbx.delete(wait=True, timeout=0.3)
    assert api.deleted
    assert isinstance(e.value, TimeoutError)
    assert not isinstance(e.value, SandboxNotReadyError)
    assert e.value.name == "s" and e.value.reason == "Timeout"
