#!/usr/bin/env python3
"""agentbox from Python in one script: the Sandbox of a scope, commands, files, the scope's
guard, a snapshot and a restore. What a harness does around each agent turn.

Needs a cluster with agentbox installed (``hack/run`` gives one) and ``pip install ./python``::

    AGENTBOX_NAMESPACE=default python examples/python/quickstart.py

``hack/test`` runs it against a namespace of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys

import agentbox


async def main() -> int:
    """The walk-through; prints what each step did."""
    namespace = os.environ.get("AGENTBOX_NAMESPACE", "default")
    image = os.environ.get("AGENTBOX_IMAGE", "docker.io/library/busybox:1.37")
    async with agentbox.Sandboxes(namespace) as sandboxes:
        # 1. The sandbox of this user of this agent: created once, found again by every
        #    harness process that asks for the same scope (racing callers get one Sandbox).
        scope = agentbox.Scope.for_user("quickstart", "alice@example.com")
        spec = agentbox.SandboxSpec(
            image=image,
            workspace=agentbox.WorkspaceSpec(
                files=[agentbox.WorkspaceFile("README.md", content="hello from agentbox\n")]
            ),
        )
        sbx = await sandboxes.get_or_create(scope, spec)
        await sbx.wait_ready(timeout=120, resume=True)
        print(f"sandbox {sbx.name} is {sbx.phase} (pod {sbx.pod_name})")

        # 2. Commands: the real exit code, output, a timeout that kills.
        result = await sbx.exec("cat README.md; exit 3")
        print(f"exit code {result.exit_code}: {result.stdout_text().strip()}")
        try:
            await sbx.exec(["sleep", "60"], timeout=1)
        except agentbox.ExecTimeoutError as e:
            print(f"timed out as asked (exit code {e.result.exit_code if e.result else None})")

        # 3. Files, confined to the workspace.
        await sbx.write("notes/todo.txt", "ship it\n")
        print("notes:", [e.name for e in await sbx.ls("notes")])
        try:
            await sbx.read("../../etc/passwd")
        except agentbox.PathError as e:
            print(f"refused before any request: {e}")

        # 4. One agent turn under the scope's guard: nobody else (another harness, the CLI,
        #    the operator's snapshots) works in this scope meanwhile.
        async with sbx.guard(wait=60) as guard, sbx.session() as shell:
            for cmd in (
                "echo step 1 >> notes/log",
                "echo step 2 >> notes/log",
                "cat notes/log",
            ):
                out = await shell.run(cmd, env={"FENCING_TOKEN": str(guard.fencing_token)})
            print(
                f"turn done under fencing token {guard.fencing_token}: {out.stdout_text().split()}"
            )

        # 5. A snapshot in object storage, and the workspace restored from it.
        snap = await sbx.snapshot(timeout=300)
        print(f"snapshot {snap.name}: {snap.size_bytes} bytes, sha256 {snap.sha256}")
        await sbx.write("notes/todo.txt", "changed after the snapshot\n")
        await sbx.restore(snap.name)
        await sbx.wait_ready(timeout=120)
        print("restored:", (await sbx.read("notes/todo.txt")).decode().strip())

        await sbx.delete(wait=True)
        print(
            "deleted; its snapshots stay:",
            [s.name for s in await sandboxes.snapshots(scope)],
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
