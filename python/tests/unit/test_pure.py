"""Pure decisions without a cluster: what a Sandbox's state means to a waiter, which condition
explains it, how API failures map onto the error hierarchy, the lineage order, and how the
sync facade's portal cancels a call whose guard is lost."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import agentbox
from agentbox import _portal
from agentbox._kube import status_error
from agentbox.client import readiness, snapshots_to_keep
from agentbox.snapshots import Snapshot, age, failing_condition


def sandbox(
    phase: str | None, mode: str = "Running", gen: int = 1, observed: int | None = 1
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "metadata": {"generation": gen},
        "spec": {"lifecycle": {"mode": mode}},
        "status": status,
    }


def stalled_sandbox(gen: int, judged: int) -> dict[str, Any]:
    obj = sandbox("Initializing", gen=gen, observed=judged)
    obj["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "CrossScopeRestore", "message": "m"},
        {
            "type": "Stalled",
            "status": "True",
            "reason": "CrossScopeRestore",
            "message": "m",
            "observedGeneration": judged,
        },
    ]
    return obj


@pytest.mark.parametrize(
    ("obj", "state"),
    [
        (sandbox("Ready"), "ready"),
        (sandbox("Failed"), "failed"),
        (sandbox("Pending"), "waiting"),
        (sandbox(None, observed=None), "waiting"),
        (sandbox("Suspended", mode="Suspended", gen=2, observed=2), "suspended"),
        # Just suspended: the phase is still Ready, but the spec says where it is going.
        (sandbox("Ready", mode="Suspended", gen=2, observed=1), "suspended"),
        # Just resumed: a Ready from before the change is not the answer yet.
        (sandbox("Ready", gen=3, observed=2), "waiting"),
        (sandbox("Suspended", gen=3, observed=3), "waiting"),
        # A start refused until something changes: no use waiting for it.
        (stalled_sandbox(gen=2, judged=2), "failed"),
        # ... unless the spec changed since it was judged.
        (stalled_sandbox(gen=3, judged=2), "waiting"),
    ],
)
def test_readiness(obj: dict[str, Any], state: str) -> None:
    assert readiness(obj) == state


def test_the_ready_condition_explains_first_then_any_false_one() -> None:
    conds = [
        {"type": "PodReady", "status": "False", "reason": "Unschedulable", "message": "m1"},
        {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "m2"},
    ]
    assert failing_condition({"status": {"conditions": conds}}) == ("InvalidSpec", "m2")
    assert failing_condition({"status": {"conditions": conds[:1]}}) == ("Unschedulable", "m1")
    assert failing_condition({}) == ("", "")
    # A stalled start explains itself first: it is what a wait ends on.
    stalled = {"type": "Stalled", "status": "True", "reason": "ImagePullBackOff", "message": "m3"}
    assert failing_condition({"status": {"conditions": [*conds, stalled]}}) == (
        "ImagePullBackOff",
        "m3",
    )
    was = {**stalled, "status": "False"}
    assert failing_condition({"status": {"conditions": [was, *conds]}}) == ("InvalidSpec", "m2")


def test_ending_a_scope_keeps_only_the_newest_ready_snapshots() -> None:
    def snap(name: str, phase: str) -> Snapshot:
        return Snapshot(name=name, sandbox="s", phase=phase, scope_key="k")

    lineage = [snap("pending", "Pending"), snap("a", "Ready"), snap("f", "Failed")]
    lineage += [snap("b", "Ready"), snap("c", "Ready")]
    assert [s.name for s in snapshots_to_keep(lineage, 0)] == []
    assert [s.name for s in snapshots_to_keep(lineage, 2)] == ["b", "c"]
    assert [s.name for s in snapshots_to_keep(lineage, 9)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (404, agentbox.NotFoundError),
        (409, agentbox.ConflictError),
        (422, agentbox.InvalidSpecError),
        (403, agentbox.ApiError),
        (500, agentbox.ApiError),
    ],
)
def test_api_failures_map_onto_the_hierarchy(code: int, cls: type[Exception]) -> None:
    body = json.dumps({"kind": "Status", "reason": "Why", "message": "the server's words"})
    err = status_error(code, "HTTP reason", body)
    assert type(err) is cls
    assert isinstance(err, agentbox.AgentboxError)
    assert "the server's words" in str(err)
    if isinstance(err, agentbox.ApiError):
        assert (err.status, err.reason, err.message) == (code, "Why", "the server's words")


def test_a_non_json_error_body_is_kept_as_the_message() -> None:
    err = status_error(502, "Bad Gateway", b"upstream down")
    assert isinstance(err, agentbox.ApiError) and err.message == "upstream down"


def test_lineage_order_is_the_operators() -> None:
    def snap(name: str, done: str | None, token: int | None) -> Snapshot:
        return Snapshot(
            name=name,
            sandbox="s",
            phase="Ready",
            scope_key="k",
            completed_at=done,
            fencing_token=token,
        )

    snaps = [
        snap("c", "2027-01-01T00:00:01Z", 3),
        snap("b", "2027-01-01T00:00:01Z", 2),
        snap("pending", None, None),
        snap("a", "2027-01-01T00:00:00Z", 9),
    ]
    assert [s.name for s in sorted(snaps, key=age)] == ["pending", "a", "b", "c"]


class FakeGuard:
    """What the portal needs of a guard."""

    def __init__(self) -> None:
        self.lease_name = "agentbox-guard-x"
        self.released = False
        self.event = asyncio.Event()

    def lose(self) -> None:
        self.event.set()

    def check(self) -> None:
        if self.event.is_set():
            raise agentbox.GuardLostError(self.lease_name)

    async def wait_lost(self) -> None:
        await self.event.wait()


def test_a_sync_call_is_cancelled_when_its_guard_is_lost() -> None:
    g = FakeGuard()
    cancelled = []

    async def long_call() -> None:
        g.lose()  # lost while this call runs
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    _portal.active_guards().append(g)  # type: ignore[arg-type]
    try:
        with pytest.raises(agentbox.GuardLostError):
            _portal.call(long_call())
        assert cancelled == [True]
        # Once lost, the next call in the block fails before it starts.
        with pytest.raises(agentbox.GuardLostError):
            _portal.call(asyncio.sleep(0))
        # A guard released by hand guards nothing any more.
        g.released = True
        assert _portal.call(asyncio.sleep(0, "ok")) == "ok"
    finally:
        _portal.active_guards().clear()


def test_the_portal_refuses_calls_from_its_own_thread() -> None:
    async def inner() -> None:
        _portal.call(asyncio.sleep(0))

    with pytest.raises(agentbox.AgentboxError, match="own event loop thread"):
        _portal.call(inner(), guarded=False)
