#!/usr/bin/env python3
"""An openai-agents ``SandboxAgent`` whose sandbox is an agentbox Sandbox. The model is the
framework's own ``ScriptedModel`` (no network, no API key): the first run writes a note with
``exec_command``; the harness keeps the run's state as JSON, as it would between two requests;
a second run resumed from it finds the note (the same Sandbox, reattached). Each run's
workspace is persisted as a SandboxSnapshot in the cluster, never through this process.

Needs a cluster with agentbox installed (``hack/run`` gives one) and
``pip install './python[openai-agents]'``::

    AGENTBOX_NAMESPACE=default python examples/python/openai_agents_agent.py

``AGENTBOX_IMAGE`` picks the image (default ``docker.io/library/busybox:1.37``, which the local
cluster imports under that name).
``hack/test`` runs it against a namespace of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from agents import Runner
from agents.result import RunResult
from agents.run import RunConfig
from agents.run_state import RunState
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ScriptedModel, assistant_message, function_call

import agentbox
from agentbox.integrations.openai_agents import (
    AgentboxSandboxClient,
    AgentboxSandboxClientOptions,
)


def last_tool_output(result: RunResult) -> str:
    """What the run's last ``exec_command`` printed (the framework's tool output)."""
    outs = [str(getattr(item, "output", "")) for item in result.new_items]
    outs = [o for o in outs if "Process exited with code" in o]
    return outs[-1] if outs else "(no exec_command output)"


def exec_then_answer(model: ScriptedModel, cmd: str, answer: str, n: int) -> None:
    """Scripts one run: the model calls ``exec_command`` with ``cmd``, then answers."""
    model.extend(
        [
            [function_call("exec_command", {"cmd": cmd}, call_id=f"call-{n}")],
            [assistant_message(answer)],
        ]
    )


async def main() -> int:
    """Two runs of one agent; the second resumes the first's sandbox from stored state."""
    namespace = os.environ.get("AGENTBOX_NAMESPACE", "default")
    scope = agentbox.Scope.for_user("openai-notes", "alice@example.com")
    model = ScriptedModel()
    agent = SandboxAgent(name="notes", instructions="Keep notes in the workspace.", model=model)
    options = AgentboxSandboxClientOptions(
        image=os.environ.get("AGENTBOX_IMAGE", "docker.io/library/busybox:1.37"),
        namespace=namespace,
        scope=scope,
    )
    config = RunConfig(
        sandbox=SandboxRunConfig(client=AgentboxSandboxClient(), options=options),
        tracing_disabled=True,  # a scripted model: nothing to send anywhere
    )

    # 1. The agent writes a note; after the run the Sandbox is suspended (pod gone, workspace
    #    kept on its node) and the workspace is in a SandboxSnapshot.
    exec_then_answer(model, "echo 'ship it' > notes.md && cat notes.md", "Saved.", 1)
    first = await Runner.run(agent, "Save my notes.", run_config=config)
    print(f"run 1: {first.final_output} | {last_tool_output(first).splitlines()[-1]}")
    stored = first.to_state().to_string()  # what a harness keeps between two requests

    # 2. Another request: the run resumes from the stored state, reattaching to the Sandbox.
    exec_then_answer(model, "cat notes.md", "Your notes say: ship it.", 2)
    started = time.monotonic()
    second = await Runner.run(agent, await RunState.from_string(agent, stored), run_config=config)
    took = time.monotonic() - started
    print(f"run 2: {second.final_output} | {last_tool_output(second).splitlines()[-1]}")
    print(f"run 2 (reattached, sandbox resumed) took {took:.1f}s")

    # 3. Done with this user for good: the scope's Sandbox and its snapshots go.
    async with agentbox.Sandboxes(namespace) as sandboxes:
        for sbx in await sandboxes.list(scope=scope):
            print(f"sandbox {sbx.name}: {sbx.obj['spec']['lifecycle']['mode']}")
        ended = await sandboxes.end_scope(scope)
        print(f"scope ended: {len(ended.deleted_snapshots)} snapshot(s) deleted")
    model.assert_complete()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
