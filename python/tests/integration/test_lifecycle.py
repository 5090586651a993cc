"""Sandbox lifecycle from Python: create by scope (racing callers get one Sandbox), open,
list, wait Ready, suspend (reported, never waited on), resume, delete; bad input refused
before any request or with the API server's own message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agentbox
from agentbox import labels

from .conftest import BASE_IMAGE, Env

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")


async def test_two_racing_get_or_create_calls_get_one_sandbox(env: Env) -> None:
    scope = agentbox.Scope.for_user("racer", "alice@example.com")
    other = agentbox.Sandboxes(env.ns, api_client=env.kube.api_client)
    a, b = await asyncio.gather(
        env.sandboxes.get_or_create(scope, SPEC), other.get_or_create(scope, SPEC)
    )
    assert a.name == b.name == labels.sandbox_name_for_scope(scope)
    assert a.obj["metadata"]["uid"] == b.obj["metadata"]["uid"]
    listed = await env.sandboxes.list(scope=scope)
    assert [s.name for s in listed] == [a.name]
    meta = a.obj["metadata"]
    assert meta["labels"] == labels.scope_labels(scope)
    assert meta["annotations"][labels.USER_ID] == "alice@example.com"
    await a.wait_ready(120)
    assert a.phase == "Ready"
    assert a.status["scopeKey"] == labels.scope_key(scope)
    opened = await env.sandboxes.open_scope(scope)
    assert opened.name == a.name and opened.scope == scope


async def wait_suspended(sbx: agentbox.Sandbox) -> None:
    """Until the operator has deleted the pod and kept the workspace."""
    for _ in range(600):
        if (await sbx.refresh()).phase == "Suspended":
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{sbx.name} not Suspended: {sbx.phase}")


async def test_suspend_is_reported_resume_waits_and_delete_removes(env: Env) -> None:
    sbx = await env.sandboxes.get_or_create(agentbox.Scope.for_agent("lifecycle"), SPEC)
    await sbx.wait_ready(120)
    await sbx.write("keep.txt", "kept\n")
    await sbx.suspend()
    # A Suspended sandbox is reported (SandboxSuspendedError), not waited on until the
    # timeout (which would raise the base SandboxNotReadyError with reason "").
    with pytest.raises(agentbox.SandboxSuspendedError) as e:
        await sbx.wait_ready(300)
    assert e.value.reason == "Suspended"
    await wait_suspended(sbx)
    await sbx.wait_ready(120, resume=True)
    assert await sbx.read("keep.txt") == b"kept\n"
    assert (sbx.status.get("workspace") or {}).get("lastStartBranch") == "A"
    # Suspended again, the harness's usual get_or_create brings it back.
    await sbx.suspend()
    await wait_suspended(sbx)
    again = await env.sandboxes.get_or_create(agentbox.Scope.for_agent("lifecycle"), SPEC)
    assert again.name == sbx.name
    await again.wait_ready(120)
    assert await again.read("keep.txt") == b"kept\n"
    await sbx.delete(wait=True)
    with pytest.raises(agentbox.NotFoundError):
        await env.sandboxes.open(sbx.name)


async def test_an_idle_sandbox_suspends_itself_and_get_or_create_brings_it_back(env: Env) -> None:
    scope = agentbox.Scope.for_agent("napper")
    spec = agentbox.SandboxSpec(
        image=BASE_IMAGE,
        image_pull_policy="Never",
        lifecycle=agentbox.Lifecycle(idle_timeout="10s"),
    )
    sbx = await env.sandboxes.get_or_create(scope, spec)
    await sbx.wait_ready(120)
    assert sbx.obj["spec"]["lifecycle"]["idleTimeout"] == "10s", "the cluster's CRD dropped it"
    # One call under the scope's guard, as a harness makes it: the idle clock starts after it.
    async with env.sandboxes.guard(scope, wait=30):
        await sbx.write("kept.txt", "kept\n")
    await wait_suspended(sbx)
    assert sbx.obj["spec"]["lifecycle"]["mode"] == "Suspended"
    ready = next(c for c in sbx.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "IdleTimeout", ready
    assert sbx.status["idleSince"] in ready["message"]
    # The harness's next call: get_or_create resumes the sandbox and wait_ready returns it
    # Ready on its workspace; then the guard for the call.
    back = await env.sandboxes.get_or_create(scope, spec)
    await back.wait_ready(120)
    assert back.phase == "Ready"
    assert back.obj["spec"]["lifecycle"]["mode"] == "Running"
    assert (back.status.get("workspace") or {}).get("lastStartBranch") == "A"
    async with env.sandboxes.guard(scope, wait=30):
        assert await back.read("kept.txt") == b"kept\n"
    await back.delete(wait=True)


async def test_open_of_a_missing_sandbox_is_not_found(env: Env) -> None:
    with pytest.raises(agentbox.NotFoundError):
        await env.sandboxes.open("no-such-sandbox")


async def test_an_invalid_spec_gets_the_api_servers_message(env: Env) -> None:
    bad = agentbox.SandboxSpec(
        image=BASE_IMAGE,
        workspace=agentbox.WorkspaceSpec(files=[agentbox.WorkspaceFile("../escape", content="x")]),
    )
    with pytest.raises(agentbox.InvalidSpecError) as e:
        await env.sandboxes.get_or_create(agentbox.Scope.for_agent("invalid"), bad)
    assert e.value.status == 422
    assert "file paths must not contain '..'" in e.value.message
    # Named restore without a name: a CEL rule of the CRD, again in the server's words.
    named: dict[str, Any] = {"image": BASE_IMAGE, "snapshot": {"restore": "Named"}}
    with pytest.raises(agentbox.InvalidSpecError, match=r"snapshot\.name is required"):
        await env.sandboxes.get_or_create(agentbox.Scope.for_agent("invalid2"), named)


async def test_a_failed_sandbox_is_reported_at_once_with_its_reason(env: Env) -> None:
    # A host mount outside the operator's allowed prefixes (none here) passes the CRD but
    # not the operator: phase Failed, reason InvalidSpec.
    spec = agentbox.SandboxSpec(
        image=BASE_IMAGE,
        image_pull_policy="Never",
        workspace=agentbox.WorkspaceSpec(mounts=[agentbox.HostMount("data", "/srv/not-allowed")]),
    )
    sbx = await env.sandboxes.get_or_create(agentbox.Scope.for_agent("failing"), spec)
    # Reported as it fails (SandboxFailedError), not at the timeout.
    with pytest.raises(agentbox.SandboxFailedError) as e:
        await sbx.wait_ready(300)
    assert e.value.reason == "InvalidSpec"
    assert "/srv/not-allowed" in e.value.message
    await sbx.delete(wait=True)


async def test_a_bad_scope_or_path_is_refused_before_any_request(
    env: Env, ready: agentbox.Sandbox
) -> None:
    # Every request goes through Kube.call (REST) or Kube.auth_headers (exec WebSockets).
    calls: list[str] = []
    kube = await env.sandboxes.kube()
    real_call, real_headers = kube.call, kube.auth_headers

    async def counting_call(method: str, path: str, **kw: Any) -> dict[str, Any]:
        calls.append(f"{method} {path}")
        return await real_call(method, path, **kw)

    async def counting_headers() -> dict[str, str]:
        calls.append("exec")
        return await real_headers()

    kube.call = counting_call  # type: ignore[method-assign]
    kube.auth_headers = counting_headers  # type: ignore[method-assign]
    try:
        with pytest.raises(agentbox.InvalidRequestError):
            agentbox.Scope(agentbox.ScopeKind.SESSION, agent="a")
        for path in ("../etc/passwd", "/etc/passwd", "a/../../b", "x\0y"):
            with pytest.raises(agentbox.PathError):
                await ready.read(path)
            with pytest.raises(agentbox.PathError):
                await ready.write(path, b"x")
        with pytest.raises(agentbox.InvalidRequestError):
            await ready.exec([])
        with pytest.raises(agentbox.InvalidRequestError):
            await ready.exec("true", env={"BAD-NAME": "x"})
        # The counters do count: a valid call goes through them.
        await ready.exec(["true"])
    finally:
        kube.call = real_call  # type: ignore[method-assign]
        kube.auth_headers = real_headers  # type: ignore[method-assign]
    assert calls == ["exec"]
