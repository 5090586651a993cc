"""A Sandbox whose image cannot be pulled, on the real cluster: every wait ends when the
operator says its start is ``Stalled`` (after its stall grace, 20 s by default) with the
kubelet's reason, whatever the timeout — the SDK's ``wait_ready`` and both framework backends
— and a framework session that never started is not persisted (no SandboxSnapshot)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from agents import Runner
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ScriptedModel

import agentbox
from agentbox.integrations.agentscope import AgentboxWorkspace
from agentbox.integrations.openai_agents import (
    AgentboxSandboxClient,
    AgentboxSandboxClientOptions,
)

from .conftest import Env

#: An image no node has. Never pulled (``image_pull_policy="Never"``): a pull would make the
#: node look up a registry, and test traffic stays on loopback.
MISSING_IMAGE = "docker.io/library/does-not-exist:nope"
#: The reason the kubelet gives for it.
PULL_FAILURES = ("ErrImageNeverPull",)
#: Far longer than the stall grace: a wait that ran out would take this long.
LONG = 300.0


def stall_of(err: BaseException) -> agentbox.SandboxFailedError:
    """The SandboxFailedError in an exception's chain (causes and contexts)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, agentbox.SandboxFailedError):
            return seen
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"no SandboxFailedError behind {err!r}")


async def snapshots(env: Env) -> list[dict[str, Any]]:
    path = f"/apis/agentbox.dev/v1alpha1/namespaces/{env.ns}/sandboxsnapshots"
    return list((await env.kube.call("GET", path)).get("items") or [])


def missing_spec() -> agentbox.SandboxSpec:
    return agentbox.SandboxSpec(image=MISSING_IMAGE, image_pull_policy="Never")


async def test_the_sdks_wait_ends_at_the_stall_with_the_kubelets_reason(env: Env) -> None:
    scope = agentbox.Scope.for_user("missing-image", "alice")
    sbx = await env.sandboxes.get_or_create(scope, missing_spec())
    began = time.monotonic()
    with pytest.raises(agentbox.SandboxNotReadyError) as raised:
        await sbx.wait_ready(LONG)
    print(f"wait_ready ended after {time.monotonic() - began:.1f}s: {raised.value}")
    # The stall (SandboxFailedError), not the timeout (the base class, reason of the moment).
    err = raised.value
    assert type(err) is agentbox.SandboxFailedError, f"{err!r}\n{env.logs()}"
    assert err.reason in PULL_FAILURES and "does-not-exist" in err.message, err
    assert err.phase == "Pending"
    await sbx.refresh()
    stalled = next(c for c in sbx.status["conditions"] if c["type"] == "Stalled")
    ready = next(c for c in sbx.status["conditions"] if c["type"] == "Ready")
    assert stalled["status"] == "True" and stalled["reason"] in PULL_FAILURES, stalled
    assert ready["reason"] in PULL_FAILURES, ready
    # Once stalled, a new wait ends at once.
    with pytest.raises(agentbox.SandboxFailedError):
        await sbx.wait_ready(LONG)
    await sbx.delete(wait=True)


async def test_an_openai_agents_run_fails_at_the_stall_and_persists_nothing(env: Env) -> None:
    agent = SandboxAgent(name="coder", instructions="Work.", model=ScriptedModel())
    options = AgentboxSandboxClientOptions(
        image=MISSING_IMAGE,
        image_pull_policy="Never",
        namespace=env.ns,
        # A Scope as it is (the dict form works too).
        scope=agentbox.Scope.for_user("missing-image", "bob"),
        ready_timeout=LONG,
    )
    config = RunConfig(
        sandbox=SandboxRunConfig(client=AgentboxSandboxClient(), options=options),
        tracing_disabled=True,
    )
    began = time.monotonic()
    with pytest.raises(Exception) as raised:  # the framework wraps it: see stall_of
        await Runner.run(agent, "go", run_config=config)
    print(f"Runner.run raised after {time.monotonic() - began:.1f}s: {raised.value!r}")
    err = stall_of(raised.value)
    assert err.reason in PULL_FAILURES and "does-not-exist" in err.message, err
    # The session never started: nothing was persisted (no snapshot asked for, none Pending),
    # and the run's cleanup suspended the Sandbox (its pod stops pulling).
    assert await snapshots(env) == []
    sbx = await env.sandboxes.open_scope(agentbox.Scope.for_user("missing-image", "bob"))
    assert sbx.obj["spec"]["lifecycle"]["mode"] == "Suspended"
    await sbx.delete(wait=True)


async def test_an_agentscope_workspace_fails_at_the_stall(env: Env) -> None:
    scope = agentbox.Scope.for_user("missing-image", "carol")
    ws = AgentboxWorkspace(scope=scope, spec=missing_spec(), namespace=env.ns, ready_timeout=LONG)
    began = time.monotonic()
    with pytest.raises(agentbox.SandboxFailedError) as raised:
        await ws.initialize()
    print(f"initialize raised after {time.monotonic() - began:.1f}s: {raised.value}")
    assert raised.value.reason in PULL_FAILURES, raised.value
    assert await snapshots(env) == []
    await (await env.sandboxes.open_scope(scope)).delete(wait=True)
