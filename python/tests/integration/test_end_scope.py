"""Ending a scope for good from Python (``Sandboxes.end_scope``), on the real cluster: its
Sandboxes go (every one of the scope, whatever its name), its snapshots but the newest ``keep``
Ready ones go with their stored tarballs, a later start of the scope restores the one kept, and
ending it again leaves nothing; agentscope's ``read_file`` of a missing file says not found."""

from __future__ import annotations

import asyncio

import pytest

import agentbox
from agentbox.integrations.agentscope import AgentboxBackend

from .conftest import BASE_IMAGE, Env

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")


async def exists(env: Env, snapshot: str) -> bool:
    try:
        await env.sandboxes.get_snapshot(snapshot)
    except agentbox.NotFoundError:
        return False
    return True


async def gone(env: Env, names: list[str]) -> None:
    """Until the snapshots ``names`` are gone (their finalizers removed the stored objects)."""
    for _ in range(600):
        left = [n for n in names if await exists(env, n)]
        if not left:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"snapshots still there: {left}\n{env.logs()}")


async def test_a_scope_ends_with_its_sandboxes_and_all_but_the_newest_snapshots(env: Env) -> None:
    scope = agentbox.Scope.for_user("ender", "dana")
    sbx = await env.sandboxes.get_or_create(scope, SPEC)
    await sbx.wait_ready(120)
    snaps = []
    for n in range(3):
        await sbx.write("state.txt", f"{n}\n")
        snaps.append(await sbx.snapshot(timeout=120))
    # A second Sandbox of the scope under a name of its own.
    extra = await env.sandboxes.create_restored(scope, SPEC, snaps[0].name, name="ender-extra")
    await extra.wait_ready(120)

    ended = await env.sandboxes.end_scope(scope, keep=1)
    assert sorted(ended.sandboxes) == sorted([sbx.name, extra.name])
    assert ended.kept_snapshots == (snaps[2].name,)
    assert ended.deleted_snapshots == (snaps[0].name, snaps[1].name)
    assert await env.sandboxes.list(scope=scope) == []
    # The deleted ones go with their tarballs (the operator's finalizer); the kept one stays.
    await gone(env, [snaps[0].name, snaps[1].name])
    assert [s.name for s in await env.sandboxes.snapshots(scope)] == [snaps[2].name]
    stored = [env.store / str(s.object_key) for s in snaps]
    assert [p.exists() for p in stored] == [False, False, True], stored

    # The scope used again starts from the snapshot kept.
    again = await env.sandboxes.get_or_create(scope, SPEC)
    await again.wait_ready(120)
    assert await again.read("state.txt") == b"2\n"
    assert again.status["restoredFrom"] == snaps[2].name

    # Ended for good: nothing of it is left; ending it again is harmless.
    last = await env.sandboxes.end_scope(scope)
    assert last.sandboxes == (again.name,) and last.kept_snapshots == ()
    assert snaps[2].name in last.deleted_snapshots
    assert await env.sandboxes.list(scope=scope) == []
    await gone(env, list(last.deleted_snapshots))
    assert await env.sandboxes.snapshots(scope) == []
    assert await env.sandboxes.end_scope(scope) == agentbox.EndedScope((), (), ())
    with pytest.raises(agentbox.InvalidRequestError):
        await env.sandboxes.end_scope(scope, keep=-1)


async def test_agentscope_read_file_of_a_missing_file_says_not_found(env: Env) -> None:
    sbx = await env.sandboxes.get_or_create(agentbox.Scope.for_agent("reader"), SPEC)
    await sbx.wait_ready(120)
    backend = AgentboxBackend(sbx)
    await backend.write_file("/workspace/here.txt", b"x")
    assert await backend.read_file("/workspace/here.txt") == b"x"
    for path in ("/workspace/nope.txt", "/workspace", "/etc/nope.txt"):
        with pytest.raises(FileNotFoundError, match="not found") as e:
            await backend.read_file(path)
        assert path in str(e.value)
    await sbx.delete(wait=True)
