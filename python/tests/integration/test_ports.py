"""Exposed ports and recovery with the SDK alone: `spec.ports` shows up in `Sandbox.endpoints`,
a server in the sandbox is reached through `Sandbox.port_forward`, and `recover()` waits
until a sandbox whose pod was deleted serves in a new pod."""

from __future__ import annotations

import asyncio

import agentbox

from .conftest import BASE_IMAGE, Env


async def http_get(pf: agentbox.PortForward) -> bytes:
    reader, writer = await asyncio.open_connection(pf.host, pf.local_port)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


async def test_endpoints_a_port_forward_to_a_server_and_recovery_in_a_new_pod(
    env: Env,
) -> None:
    spec = agentbox.SandboxSpec(
        image=BASE_IMAGE, image_pull_policy="Never", ports=[agentbox.Port("http", 8080)]
    )
    sbx = await env.sandboxes.get_or_create(agentbox.Scope.for_agent("ports"), spec)
    await sbx.recover(120)
    (ep,) = sbx.endpoints
    assert (ep.name, ep.port, ep.protocol) == ("http", 8080, "TCP")
    assert ep.host == f"sbx-{sbx.name}.{env.ns}.svc"

    await sbx.exec("mkdir -p /tmp/www && echo hello > /tmp/www/index.html", check=True)
    await sbx.exec(["httpd", "-p", "8080", "-h", "/tmp/www"], check=True)
    async with sbx.port_forward(8080) as pf:
        first, second = await asyncio.gather(http_get(pf), http_get(pf))
        assert b"200 OK" in first and first.endswith(b"hello\n")
        assert b"200 OK" in second and second.endswith(b"hello\n")

    # The pod goes; recover() returns once the workspace is served from the new pod.
    old_uid = sbx.status["workspace"]["initializedPodUid"]
    await env.kube.call("DELETE", f"/api/v1/namespaces/{env.ns}/pods/{sbx.pod_name}")
    await sbx.recover(120)
    assert sbx.status["workspace"]["initializedPodUid"] != old_uid
    assert (await sbx.exec("cat /tmp/www/index.html 2>/dev/null; echo $?")).stdout == b"1\n"
    await sbx.delete(wait=True)
