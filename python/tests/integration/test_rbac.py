"""The chart's harness ServiceAccount with the Python SDK (the Rust client's twin is
tests/rbac.rs): the chart's harness objects for the module's namespace (``helm template --set
harness.namespaces={ns}``) applied, a token of the ServiceAccount, and an SDK client with that
token and nothing else. Everything a harness does works in its namespace (create-or-get, wait,
exec, files, list, guard, session, snapshot, suspend and resume, restore, delete); in a
neighbour namespace it is refused (403), and so are the namespace's Secrets."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

import agentbox
from agentbox._kube import Kube

from .conftest import BASE_IMAGE, REPO, Env

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE)


def helm() -> str:
    """$HELM, else the helm hack/cluster caches, else helm on the PATH."""
    cached = Path.home() / ".cache" / "agentbox" / "bin" / "helm"
    return os.environ.get("HELM") or (str(cached) if cached.exists() else "helm")


def kubectl(*args: str, stdin: str = "") -> str:
    """Runs kubectl (admin credentials); fails the test with its output when it fails."""
    r = subprocess.run(
        [os.environ.get("KUBECTL", "kubectl"), *args],
        input=stdin.encode(),
        capture_output=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)}: {r.stderr.decode()}")
    return r.stdout.decode()


def harness_kubeconfig(ns: str, directory: Path) -> Path:
    """Applies the chart's harness objects for ``ns`` and writes a kubeconfig of the same
    cluster whose only credential is a token of the harness ServiceAccount."""
    rendered = subprocess.run(
        [
            helm(),
            "template",
            "rel",
            str(REPO / "charts" / "agentbox"),
            "--kube-version",
            "1.33.0",
            "--set",
            f"harness.namespaces={{{ns}}}",
            "--show-only",
            "templates/harness.yaml",
        ],
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert "kind: Role\n" in rendered, rendered
    kubectl("apply", "-f", "-", stdin=rendered)
    token = kubectl("create", "token", "agentbox-harness", "-n", ns, "--duration=1h").strip()
    admin: dict[str, Any] = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    context = (
        next(c for c in admin["contexts"] if c["name"] == admin.get("current-context"))
        if admin.get("current-context")
        else admin["contexts"][0]
    )
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    if "certificate-authority" in cluster["cluster"]:
        ca = Path(cluster["cluster"]["certificate-authority"])
        if not ca.is_absolute():
            ca = Path(os.environ["KUBECONFIG"]).parent / ca
        cluster["cluster"]["certificate-authority"] = str(ca)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "harness", "user": {"token": token}}],
        "contexts": [
            {"name": "harness", "context": {"cluster": cluster["name"], "user": "harness"}}
        ],
        "current-context": "harness",
    }
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
async def neighbour(env: Env) -> AsyncIterator[str]:
    """Another namespace, with nothing granted to the harness."""
    ns = f"py-neighbour-{secrets.token_hex(3)}"
    await env.kube.call("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    try:
        yield ns
    finally:
        await env.kube.call("DELETE", f"/api/v1/namespaces/{ns}")


async def test_the_harness_service_account_does_what_a_harness_does_and_nothing_next_door(
    env: Env, neighbour: str
) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="agentbox-py-rbac-"))
    cfg = k8s_client.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(harness_kubeconfig(env.ns, scratch)), client_configuration=cfg
    )
    api = k8s_client.ApiClient(configuration=cfg)
    try:
        home = agentbox.Sandboxes(env.ns, api_client=api)
        scope = agentbox.Scope.for_user("harness", "bob")
        sbx = await home.get_or_create(scope, SPEC)
        assert (await home.get_or_create(scope, SPEC)).name == sbx.name
        await sbx.wait_ready(120)
        r = await sbx.exec("echo hi; exit 3", timeout=30)
        assert (r.exit_code, r.stdout) == (3, b"hi\n")
        await sbx.write("notes/todo.txt", "ship it\n")
        assert await sbx.read("notes/todo.txt") == b"ship it\n"
        assert [e.name for e in await sbx.ls("notes")] == ["todo.txt"]
        assert [s.name for s in await home.list(scope=scope)] == [sbx.name]
        async with sbx.guard(wait=30) as g, sbx.session() as shell:
            out = await shell.run(
                ["sh", "-c", 'echo "$FENCE"'], env={"FENCE": str(g.fencing_token)}
            )
            assert out.stdout.decode().strip() == str(g.fencing_token)
        snap = await sbx.snapshot(timeout=300)
        assert snap.phase == "Ready"
        assert [s.name for s in await sbx.snapshots()] == [snap.name]
        await sbx.suspend()
        await sbx.wait_ready(120, resume=True)
        await sbx.restore(snap.name)
        await sbx.wait_ready(120)
        assert await sbx.read("notes/todo.txt") == b"ship it\n"
        await sbx.delete(wait=True)

        # Next door: refused.
        next_door = agentbox.Sandboxes(neighbour, api_client=api)
        with pytest.raises(agentbox.ApiError) as refused:
            await next_door.get_or_create(scope, SPEC)
        assert refused.value.status == 403, refused.value
        with pytest.raises(agentbox.ApiError) as refused:
            await next_door.list()
        assert refused.value.status == 403, refused.value
        with pytest.raises(agentbox.ApiError) as refused:
            async with next_door.guard(scope, wait=5):
                pass
        assert refused.value.status == 403, refused.value
        # Nor anything beyond a harness's needs at home, such as the namespace's Secrets.
        with pytest.raises(agentbox.ApiError) as refused:
            await Kube(api).call("GET", f"/api/v1/namespaces/{env.ns}/secrets")
        assert refused.value.status == 403, refused.value
    finally:
        await api.close()
        shutil.rmtree(scratch, ignore_errors=True)
