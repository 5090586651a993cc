"""The sync facade drives the same async core: lifecycle, exec, files, sessions, streams and
the guard (whose loss makes the next call in its block raise)."""

from __future__ import annotations

import socket
import threading

import pytest

import agentbox
from agentbox import sync

from .conftest import BASE_IMAGE, Env


def ready_sandbox(sandboxes: sync.Sandboxes, session: str) -> sync.Sandbox:
    scope = agentbox.Scope.for_session("sync", session)
    spec = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")
    return sandboxes.get_or_create(scope, spec).wait_ready(120)


def test_the_sync_api_end_to_end(env: Env) -> None:
    with sync.Sandboxes(env.ns) as sandboxes:
        sbx = ready_sandbox(sandboxes, "s-1")
        assert sbx.phase == "Ready"
        r = sbx.exec("echo hi; exit 4")
        assert (r.exit_code, r.stdout) == (4, b"hi\n")
        with pytest.raises(agentbox.ExecTimeoutError):
            sbx.exec(["sleep", "10"], timeout=0.5)
        sbx.write("f.txt", b"data")
        assert sbx.read("f.txt") == b"data"
        assert "f.txt" in [e.name for e in sbx.ls("")]
        with sbx.session() as s:
            assert s.run(["echo", "x"]).stdout == b"x\n"
        with sbx.exec_stream("echo a; echo b >&2") as st:
            events = list(st)
        assert isinstance(events[-1], agentbox.Exit) and events[-1].exit_code == 0
        # From several threads at once, through the one loop thread.
        results: list[bytes] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(sbx.exec(["echo", str(i)]).stdout))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [b"0\n", b"1\n", b"2\n", b"3\n"]
        with sbx.guard(wait=30) as g:
            assert g.fencing_token >= 1
            assert sbx.exec(["true"]).ok


def test_a_lost_sync_guard_fails_the_next_call_in_its_block(env: Env) -> None:
    with sync.Sandboxes(env.ns) as sandboxes:
        sbx = ready_sandbox(sandboxes, "s-2")
        with (
            pytest.raises(agentbox.GuardLostError),
            sbx.guard(wait=30, config=agentbox.GuardConfig(lease_duration=3)) as g,
        ):
            path = f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases/{g.lease_name}"
            from agentbox import _portal

            kube = _portal.call(sandboxes._async.kube())
            for _ in range(20):  # again when a renewal of ours came between read and write
                lease = _portal.call(kube.call("GET", path))
                lease["spec"]["holderIdentity"] = "thief"
                try:
                    _portal.call(kube.call("PUT", path, body=lease))
                    break
                except agentbox.ConflictError:
                    continue
            else:
                pytest.fail("the thief's write conflicted 20 times")
            # The next renewal (within a second) finds the lease taken; this call is cancelled.
            sbx.exec(["sleep", "30"])
        assert g.is_lost


def test_a_sync_port_forward_reaches_a_server_in_the_sandbox(env: Env) -> None:
    with sync.Sandboxes(env.ns) as sandboxes:
        scope = agentbox.Scope.for_session("sync", "s-3")
        spec = agentbox.SandboxSpec(
            image=BASE_IMAGE, image_pull_policy="Never", ports=[agentbox.Port("http", 8080)]
        )
        sbx = sandboxes.get_or_create(scope, spec).wait_ready(120)
        sbx.exec("mkdir -p /tmp/www && echo hello > /tmp/www/index.html", check=True)
        sbx.exec(["httpd", "-p", "8080", "-h", "/tmp/www"], check=True)
        # Served on the facade's loop thread while this thread blocks on its own socket.
        with sbx.port_forward(8080) as pf:
            assert (pf.host, pf.port, pf.pod) == ("127.0.0.1", 8080, sbx.pod_name)
            assert pf.local_port > 0
            for _ in range(2):
                with socket.create_connection((pf.host, pf.local_port), timeout=30) as conn:
                    conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    answer = b""
                    while chunk := conn.recv(65536):
                        answer += chunk
                assert b"200 OK" in answer and answer.endswith(b"hello\n"), answer
            port = pf.local_port
        # Closed: nothing listens there any more.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        sbx.delete(wait=True)
