"""openai-agents on agentbox, on the real cluster: a SandboxAgent driven by the framework's own
ScriptedModel runs `exec_command` and writes a file; runs resumed from the previous run's
state see it — reattached, after the pod was deleted, and after the Sandbox was deleted
(restored from its snapshot in the cluster); a timed-out exec raises the framework's timeout
error; a server in the sandbox is reached through `resolve_exposed_port`."""

from __future__ import annotations

import asyncio
import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
from agents import Runner
from agents.result import RunResult
from agents.run import RunConfig
from agents.run_state import RunState
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import Dir, File
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExposedPortUnavailableError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Environment, Manifest
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.testing import ScriptedModel, assistant_message, function_call

import agentbox
from agentbox.integrations.openai_agents import (
    AgentboxSandboxClient,
    AgentboxSandboxClientOptions,
    AgentboxSandboxSession,
)

from .conftest import BASE_IMAGE, Env

#: How much later than its timeout a timed-out exec may raise (the kill and the status frame
#: travel through the API server; the command itself would take 30 s).
TIMEOUT_MARGIN = 15.0


def options(env: Env, **kw: Any) -> AgentboxSandboxClientOptions:
    return AgentboxSandboxClientOptions(
        image=BASE_IMAGE, namespace=env.ns, image_pull_policy="Never", **kw
    )


def scripted(env: Env, **kw: Any) -> tuple[ScriptedModel, SandboxAgent[Any], RunConfig]:
    """A SandboxAgent on a ScriptedModel, and a run config on agentbox."""
    model = ScriptedModel()
    agent = SandboxAgent(name="coder", instructions="Work in the sandbox.", model=model)
    client = AgentboxSandboxClient()
    return (
        model,
        agent,
        RunConfig(sandbox=SandboxRunConfig(client=client, options=options(env, **kw))),
    )


def exec_turn(model: ScriptedModel, cmd: str, n: int) -> None:
    """One scripted turn: the model calls exec_command, then answers."""
    model.extend(
        [
            [function_call("exec_command", {"cmd": cmd}, call_id=f"call-{n}")],
            [assistant_message(f"turn {n} done")],
        ]
    )


def tool_output(result: RunResult) -> str:
    """The last exec_command output of a run."""
    outs = [str(getattr(i, "output", "")) for i in result.new_items]
    outs = [o for o in outs if "Process exited with code" in o]
    assert outs, result.new_items
    return outs[-1]


def session_state_of(result: RunResult) -> dict[str, Any]:
    sandbox = result.to_state()._sandbox
    assert sandbox is not None
    state: dict[str, Any] = sandbox["session_state"]
    return state


async def sandbox_of(env: Env, result: RunResult) -> agentbox.Sandbox:
    return await env.sandboxes.open(session_state_of(result)["sandbox_name"])


async def test_a_resumed_run_sees_the_file_reattached_after_pod_loss_and_after_sandbox_loss(
    env: Env,
) -> None:
    model, agent, config = scripted(env)

    exec_turn(model, "echo first-run > notes.txt && cat notes.txt && exit 3", 1)
    r1 = await Runner.run(agent, "write notes", run_config=config)
    assert r1.final_output == "turn 1 done"
    out = tool_output(r1)
    assert "Process exited with code 3" in out and "first-run" in out
    sbx = await sandbox_of(env, r1)
    # delete() after the run suspended it: the pod goes, the workspace stays on its node.
    assert sbx.obj["spec"]["lifecycle"]["mode"] == "Suspended"
    # The run's workspace was persisted as a SandboxSnapshot of this Sandbox, Ready. (Its
    # sandbox's status.lastSnapshot is written after the snapshot's own status: not read here.)
    snap = await env.sandboxes.wait_snapshot(session_state_of(r1)["last_snapshot"], 60)
    assert (snap.sandbox, snap.phase) == (sbx.name, "Ready")
    first_uid = sbx.obj["metadata"]["uid"]

    # Resumed: the same Sandbox, reattached (start branch A, nothing copied).
    exec_turn(model, "cat notes.txt && echo second >> notes.txt", 2)
    r2 = await Runner.run(agent, r1.to_state(), run_config=config)
    assert "first-run" in tool_output(r2)
    sbx = await sandbox_of(env, r2)
    assert sbx.obj["metadata"]["uid"] == first_uid
    assert sbx.status.get("restoredFrom") is None  # nothing was restored

    # The pod is deleted between runs (the Sandbox is suspended, so resume it first and
    # delete its pod while it runs): the workspace is still on the node.
    await sbx.resume()
    await sbx.wait_ready(120)
    await env.kube.call("DELETE", f"/api/v1/namespaces/{env.ns}/pods/{sbx.pod_name}")
    exec_turn(model, "cat notes.txt", 3)
    r3 = await Runner.run(agent, r2.to_state(), run_config=config)
    assert "first-run\nsecond" in tool_output(r3)

    # The Sandbox itself is deleted (workspace and all): the next run re-creates it restored
    # from the snapshot the last run persisted, in the cluster.
    last = session_state_of(r3)["last_snapshot"]
    await sbx.delete(wait=True)
    exec_turn(model, "cat notes.txt", 4)
    r4 = await Runner.run(agent, r3.to_state(), run_config=config)
    assert "first-run\nsecond" in tool_output(r4)
    sbx = await sandbox_of(env, r4)
    assert sbx.obj["metadata"]["uid"] != first_uid
    assert sbx.status.get("restoredFrom") == last
    assert sbx.status["workspace"]["lastStartBranch"] == "C"
    model.assert_complete()


async def test_a_run_resumes_from_its_state_stored_as_json(env: Env) -> None:
    # What a harness stores between requests: the RunState as JSON.
    model, agent, config = scripted(env)
    exec_turn(model, "echo kept > kept.txt", 1)
    r1 = await Runner.run(agent, "go", run_config=config)
    stored = r1.to_state().to_string()
    state = await RunState.from_string(agent, stored)
    exec_turn(model, "cat kept.txt", 2)
    r2 = await Runner.run(agent, state, run_config=config)
    assert "kept" in tool_output(r2)


async def test_exec_timeouts_missing_files_and_tar_persistence(env: Env, tmp_dir: Path) -> None:
    client = AgentboxSandboxClient()
    opts = options(env, workspace_persistence="tar", on_delete="delete")
    manifest = Manifest(
        entries={"brief/task.md": File(content=b"fix the tests\n"), "out": Dir()},
        environment=Environment(value={"TASK_ID": "t-42"}),
    )
    session = await client.create(
        manifest=manifest, options=opts, snapshot=LocalSnapshotSpec(base_path=tmp_dir)
    )
    inner = session._inner
    assert isinstance(inner, AgentboxSandboxSession)
    try:
        await session.start()
        # The manifest is materialised in the workspace, and its environment reaches commands.
        r = await session.exec("cat brief/task.md; test -d out && echo dir; echo $TASK_ID")
        assert r.stdout.decode().split("\n")[:3] == ["fix the tests", "dir", "t-42"]
        # Past its timeout: the framework's ExecTimeoutError, within the timeout plus a margin
        # (generous: a loaded machine), not after the command's 30 s; and the command was
        # killed (its marker never appears, no sleep is left running).
        began = time.monotonic()
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30; touch late", timeout=2)
        assert time.monotonic() - began < 2 + TIMEOUT_MARGIN
        left = await session.exec("test -e late; echo $?; ps | grep -c '[s]leep 30'")
        assert left.stdout.decode().split() == ["1", "0"]
        r = await session.exec("exit 7")
        assert r.exit_code == 7

        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("/workspace/nope.txt"))
        await session.write(Path("dir/hello.txt"), io.BytesIO(b"hello tar\n"))
        assert (await session.read(Path("dir/hello.txt"))).read() == b"hello tar\n"

        # A plain tar stream for the user's own snapshot store, and back.
        archive = await session.persist_workspace()
        raw = archive.read()
        assert not raw.startswith(b"AGENTBOX")
        await session.exec("rm -rf dir")
        await session.hydrate_workspace(io.BytesIO(raw))
        assert (await session.read(Path("dir/hello.txt"))).read() == b"hello tar\n"
    finally:
        await session.aclose()
        await client.delete(session)
    # on_delete="delete" with nothing persisted to agentbox: suspended, not deleted.
    sbx = await env.sandboxes.open(inner.state.sandbox_name)
    assert sbx.obj["spec"]["lifecycle"]["mode"] == "Suspended"
    await sbx.delete(wait=True)


async def test_a_server_in_the_sandbox_is_reached_through_resolve_exposed_port(env: Env) -> None:
    client = AgentboxSandboxClient()
    session = await client.create(
        manifest=Manifest(), options=options(env, exposed_ports=(8080,), on_delete="keep")
    )
    inner = session._inner
    assert isinstance(inner, AgentboxSandboxSession)
    try:
        await session.start()
        www = "mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html"
        r = await session.exec(f"{www} && httpd -p 8080 -h /tmp/www")
        assert r.exit_code == 0, r.stderr
        # The Sandbox asks for the port (an installed CRD without spec.ports would prune it,
        # and nothing would be exposed: say so rather than fail on the endpoint).
        await inner.sandbox.refresh()
        assert inner.sandbox.obj["spec"].get("ports") == [
            {"name": "p8080", "port": 8080, "protocol": "TCP"}
        ], f"spec.ports pruned: is crds/agentbox.yaml the installed CRD? {inner.sandbox.obj}"
        ep = await session.resolve_exposed_port(8080)
        reader, writer = await asyncio.open_connection(ep.host, ep.port)
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert b"200 OK" in answer and b"hello-port" in answer
        # The status says where the port is on the cluster: the Service and the pod IP.
        inner.state.port_access = "pod-ip"
        direct = await session.resolve_exposed_port(8080)
        status_ep = inner.sandbox.endpoints[0]
        assert (status_ep.name, status_ep.port) == ("p8080", 8080)
        assert status_ep.host.endswith(f".{env.ns}.svc")
        assert (direct.host, direct.port) == (status_ep.pod_ip, 8080)
        pod = await env.kube.call(
            "GET", f"/api/v1/namespaces/{env.ns}/pods/{inner.sandbox.pod_name}"
        )
        assert direct.host == pod["status"]["podIP"]
        # A port the options did not name is refused by the framework's own check.
        with pytest.raises(ExposedPortUnavailableError) as refused:
            await session.resolve_exposed_port(9090)
        assert refused.value.context["reason"] == "not_configured"
    finally:
        await session.aclose()
        await client.delete(session)
    await (await env.sandboxes.open(inner.state.sandbox_name)).delete(wait=True)


#: Runs at once on one scope in the contention test (pairs of two), and the counter rounds and
#: increments of each run. 9 pairs x 2 runs x 3 rounds = 54 read-modify-write rounds.
CONTENTION_PAIRS = int(os.environ.get("AGENTBOX_CONTENTION_PAIRS", "9"))
ROUNDS = 3
INCREMENTS = 20


def counting(tag: str) -> str:
    """One round: INCREMENTS read-modify-write increments of ``counter``, between log lines."""
    return (
        f"echo '{tag} start' >> rounds.log; i=0; while [ $i -lt {INCREMENTS} ]; do "
        "n=$(cat counter 2>/dev/null || echo 0); echo $((n+1)) > counter; i=$((i+1)); done; "
        f"echo '{tag} end' >> rounds.log; cat counter"
    )


async def test_two_runs_on_one_scope_never_overlap_and_lose_no_update(env: Env) -> None:
    """Two ``Runner.run``s at once on one User scope, many times: the runs' rounds never
    interleave (each run holds the scope's guard from its start through its persist), no
    increment is lost, every run's cleanup (persist under its own hold, then suspend unless
    the other run is at work) ends without waiting out a timeout, and each run's persisted
    snapshot is Ready."""
    scope = {"kind": "User", "agent": "contention", "user": "alice"}

    async def run(tag: str) -> tuple[float, str]:
        model = ScriptedModel()
        agent = SandboxAgent(name="counter", instructions="Count.", model=model)
        # ROUNDS tool calls, then the answer that ends the run.
        model.extend(
            [
                [function_call("exec_command", {"cmd": counting(tag)}, call_id=f"{tag}-{r}")]
                for r in range(ROUNDS)
            ]
            + [[assistant_message(f"{tag} done")]]
        )
        config = RunConfig(
            sandbox=SandboxRunConfig(
                client=AgentboxSandboxClient(),
                options=options(env, scope=scope, ready_timeout=120.0, guard_wait=120.0),
            )
        )
        started = time.monotonic()
        result = await Runner.run(agent, "count", run_config=config)
        took = time.monotonic() - started
        snap = session_state_of(result)["last_snapshot"]
        assert snap, "the run persisted its workspace"
        assert (await env.sandboxes.get_snapshot(snap)).phase == "Ready"
        return took, snap

    durations: list[tuple[float, float]] = []
    for pair in range(CONTENTION_PAIRS):
        (a, _), (b, _) = await asyncio.gather(run(f"a{pair}"), run(f"b{pair}"))
        durations.append((min(a, b), max(a, b)))
    sbx = await env.sandboxes.open_scope(agentbox.Scope.for_user("contention", "alice"))
    await sbx.wait_ready(120, resume=True)
    total = int((await sbx.read("counter")).decode())
    log = (await sbx.read("rounds.log")).decode().split()
    runs = 2 * CONTENTION_PAIRS
    assert total == runs * ROUNDS * INCREMENTS, f"lost {runs * ROUNDS * INCREMENTS - total}"
    # Each run's lines stand together: nobody else's round between its first and last.
    tags = [log[i] for i in range(0, len(log), 2)]
    blocks = [t for i, t in enumerate(tags) if i == 0 or tags[i - 1] != t]
    assert len(blocks) == runs and len(set(blocks)) == runs, tags
    waits = sorted(slow - fast for fast, slow in durations)
    print(
        f"contention: {runs * ROUNDS} rounds in {CONTENTION_PAIRS} pairs, 0 lost; the waiting "
        f"run's extra time p50 {waits[len(waits) // 2]:.1f}s max {waits[-1]:.1f}s; run times "
        f"{[(round(f, 1), round(s, 1)) for f, s in durations]}"
    )
    await sbx.delete(wait=True)
