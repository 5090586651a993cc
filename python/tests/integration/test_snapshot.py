"""Snapshots from Python: take one, list the scope's lineage, restore into a new sandbox of
the scope (deleted and created again: branch C, from the latest), into an existing sandbox by
name (Sandbox.restore), and into another scope (create_restored)."""

from __future__ import annotations

import pytest

import agentbox

from .conftest import BASE_IMAGE, Env

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")


async def test_snapshot_then_restore_into_a_new_sandbox_of_the_scope(env: Env) -> None:
    scope = agentbox.Scope.for_user("snapper", "bob@example.com")
    sbx = await env.sandboxes.get_or_create(scope, SPEC)
    await sbx.wait_ready(120)
    await sbx.write("work/state.txt", "one\n")
    first = await sbx.snapshot(timeout=120)
    assert first.phase == "Ready" and first.sha256 and first.size_bytes and first.members
    assert first.scope_key == agentbox.labels.scope_key(scope)
    await sbx.write("work/state.txt", "two\n")
    second = await sbx.snapshot("snapper-second", timeout=120, deletion_policy="Retain")
    assert second.name == "snapper-second"
    assert [s.name for s in await sbx.snapshots()] == [first.name, second.name]
    assert second.fencing_token is not None and first.fencing_token is not None
    assert second.fencing_token > first.fencing_token

    # The sandbox goes; the next get_or_create of the scope restores the latest snapshot.
    await sbx.delete(wait=True)
    again = await env.sandboxes.get_or_create(scope, SPEC)
    await again.wait_ready(120)
    assert await again.read("work/state.txt") == b"two\n"
    assert again.status["workspace"]["lastStartBranch"] == "C"
    assert again.status["restoredFrom"] == second.name

    # Back to the first one, in place: the sandbox is re-created from it.
    await again.restore(first.name)
    await again.wait_ready(120)
    assert await again.read("work/state.txt") == b"one\n"
    assert again.status["restoredFrom"] == first.name

    # Into another scope: refused (it would hand bob's workspace to carol) until a platform
    # administrator allows cross-scope restores in the namespace (docs/security.md).
    other = agentbox.Scope.for_user("snapper", "carol")
    refused = await env.sandboxes.create_restored(other, SPEC, second.name)
    # Held, not Failed (it waits for a change: the annotation below), and Stalled: the wait
    # raises SandboxFailedError with the reason as soon as the refusal is recorded (its timeout
    # would raise the plain SandboxNotReadyError).
    with pytest.raises(agentbox.SandboxFailedError) as held:
        await refused.wait_ready(300)
    assert held.value.reason == "CrossScopeRestore", held.value
    assert refused.phase != "Ready", "a snapshot was restored into another scope"
    await refused.delete(wait=True)
    await env.kube.call(
        "PATCH",
        f"/api/v1/namespaces/{env.ns}",
        body={"metadata": {"annotations": {"agentbox.dev/allow-cross-scope-restore": "true"}}},
        content_type="application/merge-patch+json",
    )
    # Then under that scope's name.
    copy = await env.sandboxes.create_restored(other, SPEC, second.name)
    await copy.wait_ready(120)
    assert copy.name == agentbox.labels.sandbox_name_for_scope(other)
    assert await copy.read("work/state.txt") == b"two\n"


async def test_restoring_a_missing_snapshot_is_refused(env: Env) -> None:
    scope = agentbox.Scope.for_agent("nosnap")
    try:
        await env.sandboxes.create_restored(scope, SPEC, "no-such-snapshot")
    except agentbox.NotFoundError:
        pass
    else:
        raise AssertionError("created a sandbox from a missing snapshot")
