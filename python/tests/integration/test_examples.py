"""The scripts of examples/python run as a harness author would run them (the framework ones
on a scripted model: no network); the docs' Python blocks run in test_docs.py."""

from __future__ import annotations

import os
import subprocess
import sys

import agentbox

from .conftest import REPO, Env


def run_example(env: Env, script: str) -> str:
    """Runs ``examples/python/<script>`` against the module's namespace; its stdout."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / script)],
        env={**os.environ, "AGENTBOX_NAMESPACE": env.ns},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{env.logs()}"
    return out.stdout


def test_quickstart_runs(env: Env) -> None:
    text = run_example(env, "quickstart.py")
    assert "exit code 3: hello from agentbox" in text
    assert "timed out as asked (exit code 137)" in text
    assert "refused before any request" in text
    assert "turn done under fencing token" in text and "'step', '2'" in text
    assert "restored: ship it" in text


async def test_the_openai_agents_example_runs(env: Env) -> None:
    await check_the_openai_agents_example(env)


async def check_the_openai_agents_example(env: Env) -> None:
    """Runs examples/python/openai_agents_agent.py and checks what it printed and left."""
    lines = run_example(env, "openai_agents_agent.py").splitlines()
    # The second run's own exec_command read what the first wrote: the tool output is real.
    assert "run 1: Saved. | ship it" in lines, lines
    assert "run 2: Your notes say: ship it. | ship it" in lines, lines
    assert any(line.endswith(": Suspended") for line in lines), lines
    # Ended for good: each run persisted one snapshot, and they went with the Sandbox.
    assert "scope ended: 2 snapshot(s) deleted" in lines, lines
    scope = agentbox.Scope.for_user("openai-notes", "alice@example.com")
    assert await env.sandboxes.list(scope=scope) == []


async def test_the_agentscope_example_runs(env: Env) -> None:
    check_the_agentscope_example(env)


def check_the_agentscope_example(env: Env) -> None:
    """Runs examples/python/agentscope_agent.py and checks what it printed."""
    lines = run_example(env, "agentscope_agent.py").splitlines()
    # Each answer quotes what the agent's tool printed: the Write tool's own success message.
    assert lines[0].startswith(
        "agent 1: The tool said: The file /workspace/notes.md has been written successfully"
    ), lines
    assert lines[1].startswith("agent 2: The tool said: # Notes ship it (sandbox "), lines
    assert lines[0].split("(sandbox ")[1] == lines[1].split("(sandbox ")[1], lines
    assert "in the workspace: ship it" in lines, lines
