#!/usr/bin/env python3
"""The agentbox Python SDK's figures for ``hack/bench`` (run by ``cargo bench --bench exec``
and ``--bench lifecycle``, with ``$PYTHON`` from the bench venv, where ``hack/bench`` installs
``./python``). Each subcommand prints one JSON line of samples in milliseconds.

    sdk_python.py oneshot NAMESPACE POD CONTAINER N   one-shot exec `true` (after a warm-up)
    sdk_python.py session NAMESPACE POD CONTAINER N   persistent-session command `true`
    sdk_python.py guard NAMESPACE N                   guard acquire / release, uncontended
    sdk_python.py ready NAMESPACE N IMAGE             get_or_create + wait_ready, one at a time
    sdk_python.py resume NAMESPACE N IMAGE MIB        a resumed openai-agents run's sandbox
                                                      start, reattached vs restored (needs
                                                      agentbox[openai-agents]; not in hack/bench)
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import agentbox


async def timed(n: int, once: Callable[[], Awaitable[Any]], warmup: int = 5) -> list[float]:
    """``n`` samples of ``once`` in ms, after ``warmup`` unmeasured calls."""
    for _ in range(warmup):
        await once()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await once()
        samples.append((time.perf_counter() - t) * 1000.0)
    return samples


async def oneshot(
    sandboxes: agentbox.Sandboxes, pod: str, container: str, n: int
) -> dict[str, Any]:
    """One-shot exec `true` through `agentbox.exec.run`, as the Rust bench does."""
    kube = await sandboxes.kube()

    async def once() -> None:
        r = await agentbox.exec.run(kube, sandboxes.namespace, pod, ["true"], container=container)
        if not r.ok:
            raise RuntimeError(f"true failed: {r}")

    return {"oneshot_ms": await timed(n, once)}


async def session(
    sandboxes: agentbox.Sandboxes, pod: str, container: str, n: int
) -> dict[str, Any]:
    """`true` per command in one persistent session."""
    async with agentbox.Session(sandboxes.kube, sandboxes.namespace, pod, container=container) as s:

        async def once() -> None:
            r = await s.run(["true"])
            if not r.ok:
                raise RuntimeError(f"true failed: {r}")

        return {"session_ms": await timed(n, once, warmup=20)}


async def guard(sandboxes: agentbox.Sandboxes, n: int) -> dict[str, Any]:
    """Acquire / release of one scope's guard, uncontended."""
    scope = agentbox.Scope.for_agent("bench-python-guard")
    acquire, release = [], []
    for _ in range(n + 5):
        g = sandboxes.guard(scope, wait=30)
        t = time.perf_counter()
        await g.acquire()
        t1 = time.perf_counter()
        await g.release()
        acquire.append((t1 - t) * 1000.0)
        release.append((time.perf_counter() - t1) * 1000.0)
    return {"acquire_ms": acquire[5:], "release_ms": release[5:]}


async def ready(sandboxes: agentbox.Sandboxes, n: int, image: str) -> dict[str, Any]:
    """Create → Ready as a harness sees it: get_or_create, then wait_ready."""
    spec = agentbox.SandboxSpec(
        image=image,
        workspace=agentbox.WorkspaceSpec(
            files=[agentbox.WorkspaceFile("README.md", content="hello\n")]
        ),
    )
    samples = []
    for i in range(n):
        scope = agentbox.Scope.for_session("bench-python", f"ready-{i}")
        t = time.perf_counter()
        sbx = await sandboxes.get_or_create(scope, spec)
        await sbx.wait_ready(120)
        samples.append((time.perf_counter() - t) * 1000.0)
    return {"ready_ms": samples}


async def resume(namespace: str, n: int, image: str, mib: int) -> dict[str, Any]:
    """The sandbox start of a resumed openai-agents run: ``AgentboxSandboxClient.resume`` from
    the serialised session state, then the session's ``start`` (what ``Runner.run`` does before
    the first tool call), with ``mib`` MiB of random bytes in the workspace. Reattached: the
    Sandbox was suspended by the previous run's ``delete`` (a new pod on the workspace kept on
    its node). Restored: the Sandbox was deleted, so it is created again from the SandboxSnapshot
    the previous run persisted. Each start is checked: the workspace file is there, whole.
    """
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session.sandbox_session import SandboxSession
    from agents.sandbox.snapshot import LocalSnapshotSpec

    from agentbox.integrations.openai_agents import (
        AgentboxSandboxClient,
        AgentboxSandboxClientOptions,
    )

    client = AgentboxSandboxClient()
    options = AgentboxSandboxClientOptions(image=image, namespace=namespace)
    size = mib << 20

    async def end_run(session: SandboxSession) -> dict[str, object]:
        """What the Runner does after a run; the state a harness would store."""
        await session.aclose()  # persists the workspace: a SandboxSnapshot
        await client.delete(session)  # suspends the Sandbox
        return client.serialize_session_state(session.state)

    async def resumed(stored: dict[str, object]) -> tuple[float, SandboxSession]:
        t = time.perf_counter()
        session = await client.resume(client.deserialize_session_state(dict(stored)))
        await session.start()
        took = (time.perf_counter() - t) * 1000.0
        got = await session.exec("wc -c < data.bin")
        if got.exit_code != 0 or int(got.stdout) != size:
            raise RuntimeError(
                f"the resumed workspace lost data.bin: {got.stdout!r} {got.stderr!r}"
            )
        return took, session

    reattach, restore = [], []
    async with agentbox.Sandboxes(namespace) as sandboxes:
        for _ in range(n):
            # As the Runner does: the framework's local snapshot store, which holds only the
            # small reference persist_workspace returns.
            with tempfile.TemporaryDirectory(prefix="agentbox-bench-") as base:
                store = LocalSnapshotSpec(base_path=Path(base))
                first = await client.create(manifest=Manifest(), options=options, snapshot=store)
                await first.start()
                await first.exec(f"head -c {size} /dev/urandom > data.bin")
                stored = await end_run(first)

                took, session = await resumed(stored)
                reattach.append(took)
                stored = await end_run(session)

                name = str(stored["sandbox_name"])
                await (await sandboxes.open(name)).delete(wait=True, timeout=300)
                took, session = await resumed(stored)
                restore.append(took)
                await end_run(session)
                await (await sandboxes.open(name)).delete(wait=True, timeout=300)
    return {"resume_mib": mib, "resume_reattach_ms": reattach, "resume_restore_ms": restore}


async def main(argv: list[str]) -> None:
    """Runs one subcommand and prints its JSON line."""
    cmd, ns = argv[0], argv[1]
    if cmd == "resume":
        print(json.dumps(await resume(ns, int(argv[2]), argv[3], int(argv[4]))))
        return
    async with agentbox.Sandboxes(ns) as sandboxes:
        if cmd == "oneshot":
            out = await oneshot(sandboxes, argv[2], argv[3], int(argv[4]))
        elif cmd == "session":
            out = await session(sandboxes, argv[2], argv[3], int(argv[4]))
        elif cmd == "guard":
            out = await guard(sandboxes, int(argv[2]))
        elif cmd == "ready":
            out = await ready(sandboxes, int(argv[2]), argv[3])
        else:
            raise SystemExit(f"unknown subcommand {cmd!r}\n{__doc__}")
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
