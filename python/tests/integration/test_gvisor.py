"""One sandbox under gVisor (``runtime_class_name="gvisor"``, the RuntimeClass ``hack/cluster
up`` creates) through the SDK: Ready, exec with exit codes and stdin, the file API and a
session, and the kernel it sees is gVisor's, where the module's runc sandbox sees the host's."""

from __future__ import annotations

from pathlib import Path

import agentbox

from .conftest import BASE_IMAGE, Env

#: The kernel this machine (the cluster's node) runs, read before any test.
HOST_KERNEL = Path("/proc/version").read_bytes().strip()


async def test_a_gvisor_sandbox_runs_exec_files_and_a_session_under_gvisors_kernel(
    env: Env, ready: agentbox.Sandbox
) -> None:
    scope = agentbox.Scope.for_user("py-gvisor", "alice")
    spec = agentbox.SandboxSpec(
        image=BASE_IMAGE, image_pull_policy="Never", runtime_class_name="gvisor"
    )
    sbx = await env.sandboxes.get_or_create(scope, spec)
    await sbx.wait_ready(180)

    # gVisor's kernel by its /proc/version (the current gVisor's) or its kernel log (runsc
    # 2022-12's; the current one applies the pod's seccomp profile, which refuses syslog).
    kernel = await sbx.exec("cat /proc/version; dmesg 2>&1 | head -n 1")
    assert kernel.ok, kernel
    assert b"gvisor" in kernel.stdout.lower(), kernel.stdout
    host = HOST_KERNEL
    assert host not in kernel.stdout
    # The module's sandbox runs under the node's default runtime: the host's kernel.
    assert (await ready.exec("cat /proc/version")).stdout.strip() == host

    r = await sbx.exec("cat; echo err >&2; exit 3", stdin=b"in\n")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"in\n", b"err\n")
    blob = bytes(range(256)) * 512
    await sbx.write("a/b.bin", blob)
    assert await sbx.read("a/b.bin") == blob
    async with sbx.session() as s:
        assert (await s.run("ls a")).stdout == b"b.bin\n"
        assert (await s.run("echo $((6 * 7)); exit 4")).exit_code == 4
