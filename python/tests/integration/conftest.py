"""Set-up of the integration tests, as tests/common/mod.rs does it for the Rust ones: the
real local cluster (``KUBECONFIG`` from ``hack/cluster env``), a namespace per test module,
and an operator process (the debug build of ``agentbox-operator``) watching only that
namespace, with a ``file://`` snapshot store. Every process started here is stopped by its PID;
the sandboxes, the namespace and the store directory are removed at the end, also when a test
fails."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

import agentbox
from agentbox._kube import Kube, load_api_client, sandboxes_path, snapshots_path

REPO = Path(__file__).resolve().parents[3]
BASE_IMAGE = "docker.io/library/busybox:1.37"
STORE_ROOT = Path("/var/lib/agentbox/test-snapshots")
#: The operator's default node root: this machine is the cluster's node.
NODE_ROOT = Path("/var/lib/agentbox/workspaces")


def target_dir() -> Path:
    """Where cargo put the binaries (hack/test's default, or $CARGO_TARGET_DIR)."""
    default = Path(os.environ.get("AGENTBOX_CACHE", Path.home() / ".cache" / "agentbox")) / "target"
    return Path(os.environ.get("CARGO_TARGET_DIR", default))


def binary(name: str, env: str) -> Path:
    """A debug binary of this repository (built by ``cargo test --no-run`` in hack/test)."""
    path = Path(os.environ.get(env) or target_dir() / "debug" / name)
    if not path.exists():
        pytest.fail(
            f"{path} is missing: run `cargo build --bin {name}` (hack/test does) or set ${env}"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Operator:
    """An operator process watching one namespace."""

    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; by its PID only."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 40) -> str:
        """The end of its log, for failure messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Env:
    """One test module's namespace, operator and clients."""

    ns: str
    kube: Kube
    sandboxes: agentbox.Sandboxes
    store: Path
    operators: list[Operator] = field(default_factory=list)
    #: Flags every operator of this module gets besides the usual ones (a module's
    #: ``OPERATOR_ARGS``).
    operator_args: tuple[str, ...] = ()

    def start_operator(self) -> Operator:
        """Starts an operator for the namespace (file:// store under /var/lib/agentbox)."""
        log = Path(tempfile.gettempdir()) / f"agentbox-py-{self.ns}-{len(self.operators)}.log"
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            proc = self._spawn(out)
        op = Operator(proc, log)
        self.operators.append(op)
        return op

    def _spawn(self, out: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                str(binary("agentbox-operator", "AGENTBOX_OPERATOR_BIN")),
                "--namespace",
                self.ns,
                "--identity",
                f"op-{self.ns}-{len(self.operators)}",
                "--metrics-addr",
                f"127.0.0.1:{free_port()}",
                "--lease-seconds",
                "10",
                "--store-url",
                f"file://{self.store}",
                "--store-prefix",
                "snaps",
                *self.operator_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "RUST_LOG": os.environ.get("RUST_LOG", "info,agentbox=debug"),
                # The trusted image of its node-side pods (hack/cluster up imports it): without
                # one, deleted sandboxes keep their workspaces and wait (docs/security.md).
                "AGENTBOX_HELPER_IMAGE": os.environ.get("AGENTBOX_HELPER_IMAGE")
                or "docker.io/agentbox/helper:dev",
            },
        )

    def node_root(self) -> Path:
        """The operators' node root: the module's ``--node-root``, else the default."""
        args = self.operator_args
        if "--node-root" in args[:-1]:
            return Path(args[args.index("--node-root") + 1])
        return NODE_ROOT

    def logs(self) -> str:
        """Every operator's log tail."""
        return "\n".join(f"--- {o.log} ---\n{o.tail()}" for o in self.operators)


async def ensure_crds(kube: Kube) -> None:
    """Server-side applies crds/agentbox.yaml (as the Rust tests do) and waits until served."""
    import yaml

    for crd in yaml.safe_load_all((REPO / "crds" / "agentbox.yaml").read_text()):
        if not crd:
            continue
        name = crd["metadata"]["name"]
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        await kube.call(
            "PATCH",
            path,
            query={"fieldManager": "agentbox-tests", "force": "true"},
            body=crd,
            content_type="application/apply-patch+yaml",
        )
        for _ in range(300):
            got = await kube.call("GET", path)
            conds = (got.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                break
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    """A namespace with its own operator, torn down at the end of the module. A module may set
    ``OPERATOR_ARGS`` (more operator flags) and ``NAMESPACE_ANNOTATIONS`` (on its namespace).
    """
    if not os.environ.get("KUBECONFIG"):
        pytest.fail('no cluster: run `eval "$(hack/cluster env)"` or use hack/test')
    kube = Kube(await load_api_client())
    await ensure_crds(kube)
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    ns = f"py-{module}-{secrets.token_hex(3)}"
    annotations = dict(getattr(request.module, "NAMESPACE_ANNOTATIONS", {}))
    await kube.call(
        "POST", "/api/v1/namespaces", body={"metadata": {"name": ns, "annotations": annotations}}
    )
    # Pods need the namespace's default ServiceAccount, made by the controller-manager.
    for _ in range(100):
        if await kube.get_opt(f"/api/v1/namespaces/{ns}/serviceaccounts/default") is not None:
            break
        await asyncio.sleep(0.1)
    e = Env(
        ns,
        kube,
        agentbox.Sandboxes(ns, api_client=kube.api_client),
        STORE_ROOT / ns,
        operator_args=tuple(getattr(request.module, "OPERATOR_ARGS", ())),
    )
    e.start_operator()
    try:
        yield e
    finally:
        await teardown(e)
        await kube.close()


async def teardown(e: Env) -> None:
    """Deletes every SandboxSnapshot and Sandbox while the operator runs (its finalizers
    remove stored objects, pods and workspace directories), stops the operators, and deletes the
    namespace, the store directory and the namespace's (then empty) workspace directory. What
    the operator did not finish in time loses its finalizers, so the namespace never stays
    Terminating."""
    collections = (snapshots_path(e.ns), sandboxes_path(e.ns))
    try:
        for path in collections:
            await e.kube.call("DELETE", path)
        for _ in range(900):  # 3 minutes: a loaded machine schedules cleanup pods slowly
            left = [(await e.kube.call("GET", p)).get("items") or [] for p in collections]
            if not any(left):
                break
            await asyncio.sleep(0.2)
    finally:
        for o in e.operators:
            o.stop()
            o.log.unlink(missing_ok=True)
        try:
            for path in collections:  # nobody runs the finalizers any more
                for obj in (await e.kube.call("GET", path)).get("items") or []:
                    await e.kube.call(
                        "PATCH",
                        f"{path}/{obj['metadata']['name']}",
                        body={"metadata": {"finalizers": None}},
                        content_type="application/merge-patch+json",
                    )
            await e.kube.call("DELETE", f"/api/v1/namespaces/{e.ns}")
        finally:
            shutil.rmtree(e.store, ignore_errors=True)
            shutil.rmtree(e.node_root() / e.ns, ignore_errors=True)


@pytest.fixture(scope="module")
def sandboxes(env: Env) -> agentbox.Sandboxes:
    """The async client of the module's namespace."""
    return env.sandboxes


@pytest.fixture(scope="module")
async def ready(env: Env) -> agentbox.Sandbox:
    """One Ready sandbox for the module (a Session scope of its own)."""
    scope = agentbox.Scope.for_session("py-tests", env.ns)
    sbx = await env.sandboxes.get_or_create(
        scope, agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")
    )
    try:
        await sbx.wait_ready(120)
    except agentbox.SandboxNotReadyError as err:
        pytest.fail(f"{err}\n{env.logs()}")
    return sbx


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    """A scratch directory, removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="agentbox-py-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
