"""Out of memory said out loud through the SDK: a command its sandbox's memory limit kills
raises :class:`agentbox.OutOfMemoryError` (one-shot exec and session), not exit code 137, and
the sandbox carries on. The hog bounds itself: 200 MiB of zeros into ``tail``, with a timeout.
Under gVisor the hog takes the whole sandbox with it (the kernel kills gVisor's runtime, which
holds every process): the error says so (``container``), from the kubelet's ``OOMKilled``
(docs/security.md, "Memory under gVisor")."""

from __future__ import annotations

import asyncio

import pytest

import agentbox

from .conftest import BASE_IMAGE, Env

HOG = "head -c 209715200 /dev/zero | tail"
LIMITS = {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}


async def test_a_command_killed_for_memory_is_out_of_memory(env: Env) -> None:
    sbx = await env.sandboxes.get_or_create(
        agentbox.Scope.for_user("py-oom", "runc"),
        agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never", resources=LIMITS),
    )
    await sbx.wait_ready(180)
    with pytest.raises(agentbox.OutOfMemoryError) as e:
        await sbx.exec(HOG, timeout=60)
    assert not e.value.container, e.value
    assert "out of memory" in str(e.value)
    async with sbx.session() as s:
        with pytest.raises(agentbox.OutOfMemoryError) as e:
            await s.run(HOG, timeout=60)
        assert not e.value.container
        assert (await s.run("echo still")).stdout == b"still\n"
    assert (await sbx.exec("echo alive")).stdout == b"alive\n"


async def _back(sbx: agentbox.Sandbox) -> None:
    """Until the sandbox answers again (the kubelet restarts the killed container)."""
    for _ in range(120):
        try:
            if (await sbx.exec("echo back")).stdout == b"back\n":
                return
        except agentbox.AgentboxError:
            pass
        await asyncio.sleep(1)
    raise AssertionError("the sandbox did not come back after its container was killed")


async def test_under_gvisor_a_command_killed_for_memory_is_out_of_memory_of_the_container(
    env: Env,
) -> None:
    sbx = await env.sandboxes.get_or_create(
        agentbox.Scope.for_user("py-oom", "gvisor"),
        agentbox.SandboxSpec(
            image=BASE_IMAGE,
            image_pull_policy="Never",
            resources=LIMITS,
            runtime_class_name="gvisor",
        ),
    )
    await sbx.wait_ready(180)
    with pytest.raises(agentbox.OutOfMemoryError) as e:
        await sbx.exec(HOG, timeout=60)
    assert e.value.container, e.value
    assert "out of memory" in str(e.value)
    await _back(sbx)
    with pytest.raises(agentbox.OutOfMemoryError) as e:
        async with sbx.session() as s:
            await s.run(HOG, timeout=60)
    assert e.value.container, e.value
    await _back(sbx)
