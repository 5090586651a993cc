"""Out of memory said out loud through the SDK: a command its sandbox's memory limit kills
raises :class:`agentbox.OutOfMemoryError` (one-shot exec and session), not exit code 137; under
gVisor, where the sandbox's own runtime counts against the limit and running out kills the whole
container, with ``container`` true. The hog bounds itself: 200 MiB of zeros into ``tail``, with
a timeout."""

from __future__ import annotations

import pytest

import agentbox

from .conftest import BASE_IMAGE, Env

HOG = "head -c 209715200 /dev/zero | tail"
LIMITS = {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}


async def test_a_command_killed_for_memory_is_out_of_memory_under_runc_and_gvisor(
    env: Env,
) -> None:
    runc = await env.sandboxes.get_or_create(
        agentbox.Scope.for_user("py-oom", "runc"),
        agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never", resources=LIMITS),
    )
    gvisor = await env.sandboxes.get_or_create(
        agentbox.Scope.for_user("py-oom", "gvisor"),
        agentbox.SandboxSpec(
            image=BASE_IMAGE,
            image_pull_policy="Never",
            resources=LIMITS,
            runtime_class_name="gvisor",
        ),
    )
    await runc.wait_ready(180)
    await gvisor.wait_ready(180)

    # runc: the command alone, in a one-shot exec and in a session; the sandbox carries on.
    with pytest.raises(agentbox.OutOfMemoryError) as e:
        await runc.exec(HOG, timeout=60)
    assert not e.value.container, e.value
    assert "out of memory" in str(e.value)
    async with runc.session() as s:
        with pytest.raises(agentbox.OutOfMemoryError) as e:
            await s.run(HOG, timeout=60)
        assert not e.value.container
        assert (await s.run("echo still")).stdout == b"still\n"
    assert (await runc.exec("echo alive")).stdout == b"alive\n"

    # gVisor: the whole container goes, and the client says so from the kubelet's OOMKilled.
    with pytest.raises(agentbox.OutOfMemoryError) as e:
        await gvisor.exec(HOG, timeout=60)
    assert e.value.container, e.value
