"""Out of memory said out loud through the SDK: a command its sandbox's memory limit kills
raises :class:`agentbox.OutOfMemoryError` (one-shot exec and session), not exit code 137, and
the sandbox carries on. The hog bounds itself: 200 MiB of zeros into ``tail``, with a timeout.
(Under gVisor on the test cluster the kubelet does not record ``OOMKilled``: docs/security.md,
"Memory under gVisor".)"""

from __future__ import annotations

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
