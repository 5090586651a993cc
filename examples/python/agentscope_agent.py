#!/usr/bin/env python3
"""An agentscope agent whose built-in tools run in agentbox: its workspace is the Sandbox of a
user scope, so it outlives this process and the pod. The model is scripted (no network, no API
key): the first agent writes a note with the Write tool and closes its workspace (the Sandbox
is suspended); a second agent, in a new workspace of the same scope, reads it back with Bash.

Needs a cluster with agentbox installed (``hack/run`` gives one) and
``pip install './python[agentscope]'``::

    AGENTBOX_NAMESPACE=default python examples/python/agentscope_agent.py

``AGENTBOX_IMAGE`` picks the image (default ``docker.io/library/busybox:1.37``, which the local
cluster imports under that name).
``hack/test`` runs it against a namespace of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncGenerator
from typing import Any

from agentscope.agent import Agent
from agentscope.credential import CredentialBase
from agentscope.formatter import OpenAIChatFormatter
from agentscope.message import DataBlock, Msg, TextBlock, ThinkingBlock, ToolCallBlock
from agentscope.model import ChatModelBase, ChatResponse
from agentscope.permission import PermissionContext, PermissionMode
from agentscope.state import AgentState
from agentscope.tool import Toolkit
from pydantic import BaseModel

import agentbox
from agentbox.integrations.agentscope import AgentboxWorkspace

Block = TextBlock | ToolCallBlock | ThinkingBlock | DataBlock


class ScriptedChatModel(ChatModelBase):
    """A chat model that answers from a script: each call returns the next response; a
    ``None`` entry answers with what the last tool call returned.
    """

    class Parameters(BaseModel):
        """No parameters."""

    def __init__(self, script: list[list[Block] | None]) -> None:
        super().__init__(CredentialBase(), "scripted", self.Parameters(), stream=False)
        # The agent asks the model's formatter which media it takes; nothing is formatted.
        self.formatter = OpenAIChatFormatter()
        self.script = list(script)

    async def _call_api(
        self,
        model_name: str,
        messages: list[Msg],
        tools: Any = None,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> ChatResponse | AsyncGenerator[ChatResponse, None]:
        step = self.script.pop(0)
        if step is None:
            said = " ".join(last_tool_output(messages).split())  # on one line
            step = [TextBlock(text=f"The tool said: {said}")]
        return ChatResponse(content=step, is_last=True)


def last_tool_output(messages: list[Msg]) -> str:
    """The text of the last tool result in the conversation."""
    results = [b for m in messages for b in m.get_content_blocks("tool_result")]
    if not results:
        return ""
    out = results[-1].output
    return out if isinstance(out, str) else "".join(getattr(b, "text", "") for b in out)


def call(n: int, tool: str, **args: str) -> ToolCallBlock:
    """The model's call of ``tool`` with ``args``."""
    return ToolCallBlock(id=f"call-{n}", name=tool, input=json.dumps(args))


async def turn(workspace: AgentboxWorkspace, script: list[list[Block] | None], ask: str) -> str:
    """One agent turn in ``workspace`` on a scripted model; the agent's answer."""
    agent = Agent(
        name="notes",
        system_prompt=await workspace.get_instructions(),
        model=ScriptedChatModel(script),
        toolkit=Toolkit(tools=await workspace.list_tools()),
        # The tools run in the sandbox, not on this machine: agentscope's mode for sandboxed
        # environments, where no one is there to confirm each write.
        state=AgentState(permission_context=PermissionContext(mode=PermissionMode.BYPASS)),
    )
    reply = await agent.reply(Msg(name="user", role="user", content=[TextBlock(text=ask)]))
    return reply.get_text_content() or ""


async def main() -> int:
    """Two agents, one workspace: the second finds what the first wrote."""
    namespace = os.environ.get("AGENTBOX_NAMESPACE", "default")
    scope = agentbox.Scope.for_user("agentscope-notes", "alice@example.com")
    spec = agentbox.SandboxSpec(
        image=os.environ.get("AGENTBOX_IMAGE", "docker.io/library/busybox:1.37")
    )

    # 1. The Write tool writes into the sandbox's workspace; closing suspends the Sandbox.
    async with AgentboxWorkspace(scope=scope, spec=spec, namespace=namespace) as ws:
        write = call(1, "Write", file_path="/workspace/notes.md", content="# Notes\nship it\n")
        answer = await turn(ws, [[write], None], "Save my notes.")
        print(f"agent 1: {answer} (sandbox {ws.sandbox.name})")

    # 2. Another workspace of the same scope (another process would do the same) resumes the
    #    Sandbox: the file is there. This one deletes the Sandbox when it closes.
    async with AgentboxWorkspace(
        scope=scope, spec=spec, namespace=namespace, on_close="delete"
    ) as ws:
        bash = call(2, "Bash", command="cat notes.md")
        answer = await turn(ws, [[bash], None], "What do my notes say?")
        print(f"agent 2: {answer} (sandbox {ws.sandbox.name})")
        print(
            "in the workspace:",
            (await ws.sandbox.read("notes.md")).decode().split("\n")[1],
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
