"""Sandboxes from SandboxTemplates in Python: made from a template with the sandbox's own
env and files, the templates and pools listed, and a missing template refused before anything
is created."""

from __future__ import annotations

import pytest

import agentbox
from agentbox._kube import pools_path, templates_path

from .conftest import BASE_IMAGE, Env

TEMPLATE = {
    "apiVersion": "agentbox.dev/v1alpha1",
    "kind": "SandboxTemplate",
    "metadata": {"name": "py-agent"},
    "spec": {
        "image": BASE_IMAGE,
        "imagePullPolicy": "Never",
        "env": [{"name": "FROM_TEMPLATE", "value": "yes"}, {"name": "MODE", "value": "template"}],
        "workspace": {"files": [{"path": "AGENTS.md", "content": "template rules\n"}]},
    },
}


async def test_a_sandbox_from_a_template_runs_it_with_its_own_env_and_files(env: Env) -> None:
    scope = agentbox.Scope.for_user("py-templates", "alice")
    with pytest.raises(agentbox.NotFoundError, match="sandboxtemplate"):
        await env.sandboxes.get_or_create(scope, agentbox.SandboxSpec.from_template("py-agent"))
    assert await env.sandboxes.list(scope=scope) == []

    await env.kube.call("POST", templates_path(env.ns), body=TEMPLATE)
    assert [t["metadata"]["name"] for t in await env.sandboxes.templates()] == ["py-agent"]
    spec = agentbox.SandboxSpec.from_template(
        "py-agent",
        env={"MODE": "sandbox"},
        workspace=agentbox.WorkspaceSpec(files=[agentbox.WorkspaceFile("task.md", content="t\n")]),
    )
    sbx = await env.sandboxes.get_or_create(scope, spec)
    await sbx.wait_ready(120)
    r = await sbx.exec('echo "$FROM_TEMPLATE $MODE"; cat AGENTS.md task.md')
    assert r.exit_code == 0, r
    assert r.stdout == b"yes sandbox\ntemplate rules\nt\n"
    assert sbx.status["template"]["name"] == "py-agent"


async def test_the_namespaces_pools_are_listed(env: Env) -> None:
    pool = {
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "py-pool"},
        # No warm pods: the listing is what is tested, not the pool.
        "spec": {"templateRef": {"name": "py-agent"}, "replicas": 0},
    }
    await env.kube.call("POST", pools_path(env.ns), body=pool)
    pools = await env.sandboxes.pools()
    assert [(p["metadata"]["name"], p["spec"]["templateRef"]["name"]) for p in pools] == [
        ("py-pool", "py-agent")
    ]
    await env.kube.call("DELETE", pools_path(env.ns, "py-pool"))
