"""agentscope on agentbox, on the real cluster: the built-in Bash, Read and Write tools run
through AgentboxBackend in workspaces an AgentboxWorkspaceManager hands out per isolation
policy; two users' workspaces do not see each other's files; a user's workspace comes back
after its pod is deleted, and in a new manager (another process) after it was closed."""

from __future__ import annotations

import asyncio
from typing import Any

from agentscope.app.workspace_manager import IsolationPolicy
from agentscope.message import ToolResultState
from agentscope.tool import ToolBase

import agentbox
from agentbox.integrations.agentscope import AgentboxWorkspace, AgentboxWorkspaceManager

from .conftest import BASE_IMAGE, Env

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")


async def tools(ws: AgentboxWorkspace) -> dict[str, ToolBase]:
    return {t.name: t for t in await ws.list_tools()}


def text(chunk: Any) -> str:
    return "".join(getattr(b, "text", "") for b in chunk.content)


async def bash(ws: AgentboxWorkspace, command: str) -> tuple[str, str]:
    """Runs the Bash tool; its last chunk's state and text."""
    chunks = [c async for c in (await tools(ws))["Bash"].call(command=command)]
    return str(chunks[-1].state), text(chunks[-1])


async def read(ws: AgentboxWorkspace, path: str) -> tuple[str, str]:
    chunk = await (await tools(ws))["Read"].call(file_path=path)
    return str(chunk.state), text(chunk)


async def test_users_get_their_own_workspaces_and_the_builtin_tools_run_in_them(env: Env) -> None:
    async with AgentboxWorkspaceManager(
        spec=SPEC, namespace=env.ns, isolation=IsolationPolicy.PER_AGENT
    ) as manager:
        alice = await manager.get_workspace("alice@example.com", "coder", "s1")
        alice_sandbox = alice.sandbox.name
        bob = await manager.get_workspace("bob", "coder", "s2")
        assert alice.scope == agentbox.Scope.for_user("coder", "alice@example.com")
        assert alice.sandbox.name != bob.sandbox.name
        # The same user and agent in another session: the same workspace.
        assert await manager.get_workspace("alice@example.com", "coder", "s3") is alice

        write = (await tools(alice))["Write"]
        chunk = await write.call(file_path="/workspace/notes/todo.txt", content="ship it\n")
        assert chunk.state != ToolResultState.ERROR, text(chunk)
        state, out = await bash(alice, "cat notes/todo.txt && echo exit-$? && pwd")
        assert state != ToolResultState.ERROR and "ship it\nexit-0\n/workspace" in out, out
        state, out = await read(alice, "/workspace/notes/todo.txt")
        assert state != ToolResultState.ERROR and "ship it" in out, out
        state, out = await bash(alice, "exit 3")
        assert state == ToolResultState.ERROR

        # Bob's workspace is another directory on the node: Alice's file is not there.
        state, out = await read(bob, "/workspace/notes/todo.txt")
        assert state == ToolResultState.ERROR and "does not exist" in out, out
        _, out = await bash(bob, "ls -a /workspace; test -e notes/todo.txt; echo found-$?")
        assert "found-1" in out and "todo" not in out, out

        # Alice's pod is deleted: the operator starts a new one on her workspace, and the
        # tools carry on in it.
        old_pod_uid = alice.sandbox.status["workspace"]["initializedPodUid"]
        pod_path = f"/api/v1/namespaces/{env.ns}/pods/{alice.sandbox.pod_name}"
        await env.kube.call("DELETE", pod_path)
        # Until its container stops, the deleted pod may still answer the tool: wait for it to
        # be gone, so the read below is the one that finds the new pod.
        for _ in range(600):
            pod = await env.kube.get_opt(pod_path)
            if pod is None or pod["metadata"]["uid"] != old_pod_uid:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"pod {alice.sandbox.pod_name} still there after 120 s")
        state, out = await read(alice, "/workspace/notes/todo.txt")
        assert state != ToolResultState.ERROR and "ship it" in out, out
        await alice.sandbox.refresh()
        assert alice.sandbox.status["workspace"]["initializedPodUid"] != old_pod_uid
        assert alice.sandbox.status["workspace"]["lastStartBranch"] == "A"

    # Closed: suspended, workspace kept. A new manager (another process, another day) maps the
    # same user and agent to the same scope, resumes the Sandbox, and the file is there.
    sbx = await env.sandboxes.open(alice_sandbox)
    assert sbx.obj["spec"]["lifecycle"]["mode"] == "Suspended"
    async with AgentboxWorkspaceManager(
        spec=SPEC, namespace=env.ns, isolation=IsolationPolicy.PER_AGENT
    ) as manager:
        again = await manager.get_workspace("alice@example.com", "coder", "s9")
        assert again.sandbox.name == alice_sandbox
        state, out = await read(again, "/workspace/notes/todo.txt")
        assert state != ToolResultState.ERROR and "ship it" in out, out


async def test_a_workspace_id_names_its_scope_for_any_process(env: Env) -> None:
    async with AgentboxWorkspaceManager(
        spec=SPEC, namespace=env.ns, isolation=IsolationPolicy.PER_SESSION, on_close="delete"
    ) as manager:
        wid = await manager.assign_workspace_id(user_id="u", agent_id="a", session_id="s-1")
        ws = await manager.get_workspace("someone-else", "other", "x", workspace_id=wid)
        assert ws.scope == agentbox.Scope.for_session("a", "s-1")
        backend = ws.get_backend()
        await backend.write_file("/workspace/deep/a/b.txt", b"x")
        assert await backend.is_dir("/workspace/deep")
        assert [e.name for e in await backend.scandir("/workspace/deep/a")] == ["b.txt"]
        assert await backend.list_dir("/workspace/deep", recursive=True) == [
            "/workspace/deep/a/b.txt"
        ]
        timed = await backend.exec_shell(["sleep", "30"], timeout=1)
        assert (timed.exit_code, timed.stderr) == (-1, b"timed out")
        missing = await backend.exec_shell(["no-such-program"])
        assert missing.exit_code == 127
        await backend.delete_path("/workspace/deep")
        assert not await backend.file_exists("/workspace/deep")
    # on_close="delete": the Sandbox goes (or is going).
    left = await env.sandboxes.list(scope=agentbox.Scope.for_session("a", "s-1"))
    assert all(s.obj["metadata"].get("deletionTimestamp") for s in left)
