"""agentbox as a sandbox backend of openai-agents (``agents.sandbox``).

::

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxRunConfig
    from agentbox.integrations.openai_agents import (
        AgentboxSandboxClient, AgentboxSandboxClientOptions)

    run_config = RunConfig(sandbox=SandboxRunConfig(
        client=AgentboxSandboxClient(),
        options=AgentboxSandboxClientOptions(
            image="docker.io/library/busybox:1.37", namespace="agents"
        ),
    ))
    result = await Runner.run(agent, "...", run_config=run_config)

``network`` in the options says what the sandbox may reach: ``agentbox.Network("None")``
(nothing), ``Network("All")``, or ``Network("Allowlist", [EgressAllow("10.0.0.0/8",
[EgressPort(443)])])`` (only those address blocks and ports), or the dict form of any of them.
Left unset, the cluster's default applies: the operator's ``--default-egress``, ``None`` unless
the administrator changed it. A bad value is refused when the options are made, before any
request.

How the framework's session contract maps onto agentbox:

- ``create`` gets (or creates) the Sandbox of the options' scope (an ``agentbox.Scope`` or its
  dict form) — by default a Session scope of this session — and the manifest is materialised
  in its workspace when the session starts; ``start`` waits until the Sandbox serves (resuming
  it if its ``idleTimeout`` suspended it) and then takes the scope's guard (the Lease that
  serialises work on a scope), which the session holds for the run; a sandbox suspended in
  between is resumed and waited for again. A Sandbox that cannot start (an image that cannot
  be pulled, ...) fails ``start`` with ``WorkspaceStartError`` as soon as the operator says
  its start is ``Stalled`` (its stall grace, 20 s by default), whatever ``ready_timeout`` is,
  and a session that never started is not persisted.
- Commands run over ``pods/exec`` with their real exit code; a timeout raises the framework's
  ``ExecTimeoutError`` (the command's process group is killed in the pod), a broken connection
  its ``ExecTransportError``, a missing file its ``WorkspaceReadNotFoundError``. A command that
  could not start because the pod was being replaced runs again once the new pod serves.
- ``persist_workspace`` asks the operator for a ``SandboxSnapshot`` (taken under the run's
  hold of the scope's guard, handed to the operator and kept, so no other run works in
  between) and returns a small reference to it, as hosted backends return a native
  snapshot id: the workspace's bytes go from the pod to object storage and never through this
  process. ``hydrate_workspace`` restores from such a reference in the cluster, and still takes
  a plain tar stream (``workspace_persistence="tar"`` makes ``persist_workspace`` return one, for
  a snapshot store of the user's own).
- ``resume`` reattaches to the same Sandbox when it exists (its workspace is still on its node:
  start branch A, nothing copied), and otherwise creates it again restored from the last
  snapshot this session persisted (start branch C, restored by the operator before Ready).
- ``delete`` (the Runner calls it after every run) suspends the Sandbox by default, under the
  scope's guard (left to another run that holds it: that run is at work there): the pod
  goes, the workspace stays on its node, and the next run's ``resume`` reattaches in about a
  pod start. Deleting it instead (``on_delete="delete"``, done only once a snapshot exists)
  frees the node's disk but makes every resume a restore from object storage, which takes time
  proportional to the workspace; ``on_delete="keep"`` leaves the pod running.
- A scope's Sandbox and snapshots outlive its runs; ``agentbox.Sandboxes.end_scope(scope)``
  removes them for good (``keep=N`` keeps the newest snapshots).
- ``resolve_exposed_port`` returns where a port of ``exposed_ports`` is reached: the Service's
  cluster DNS name from inside the cluster, and from outside a port-forward through the API
  server on ``127.0.0.1`` (``port_access`` chooses explicitly).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import tarfile
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal, cast

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
from pydantic import BaseModel, Field, field_serializer, field_validator

from .. import errors as ab_errors
from .. import exec as ab_exec
from ..client import Sandbox, Sandboxes, readiness
from ..exec import Exit, Output
from ..guard import Guard
from ..ports import PortForward
from ..scope import Scope
from ..spec import Network, Port, SandboxSpec, SnapshotPolicy, WorkspaceSpec
from ._network import network_json, network_of
from ._pods import in_pod, stop_unless_busy

__all__ = [
    "AgentboxSandboxClient",
    "AgentboxSandboxClientOptions",
    "AgentboxSandboxSession",
    "AgentboxSandboxSessionState",
    "RunPolicy",
    "decode_reference",
    "encode_reference",
]

BACKEND_ID = "agentbox"
#: Agent id of the default scope (a Session scope per framework session).
DEFAULT_AGENT = "openai-agents"
#: What a reference to a SandboxSnapshot starts with (a tar stream never does: its first
#: bytes are a member name).
REFERENCE_MAGIC = b"AGENTBOX_SANDBOX_SNAPSHOT_V1\n"
#: How long ``resolve_exposed_port`` waits for the operator to record a port's endpoint.
ENDPOINT_WAIT = 30.0
#: Workspace entries that are the operator's, never archived.
OPERATOR_STATE = ".agentbox"

OnDelete = Literal["suspend", "delete", "keep"]
Persistence = Literal["snapshot", "tar"]
PortAccess = Literal["auto", "service", "pod-ip", "port-forward"]


def encode_reference(snapshot: str, namespace: str, sandbox: str, sandbox_uid: str) -> bytes:
    """The bytes ``persist_workspace`` returns for a SandboxSnapshot: a short marker and JSON."""
    body = {"namespace": namespace, "sandbox": sandbox, "sandboxUid": sandbox_uid}
    body["snapshot"] = snapshot
    return REFERENCE_MAGIC + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_reference(raw: bytes) -> dict[str, str] | None:
    """The fields of a reference, or ``None`` when ``raw`` is not one (a tar stream)."""
    if not raw.startswith(REFERENCE_MAGIC):
        return None
    try:
        body = json.loads(raw[len(REFERENCE_MAGIC) :].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("snapshot"), str):
        return None
    return {k: str(v) for k, v in body.items()}


class RunPolicy(BaseModel):
    """How a session treats its Sandbox; set in the options, kept in the session state."""

    on_delete: OnDelete = "suspend"
    workspace_persistence: Persistence = "snapshot"
    port_access: PortAccess = "auto"
    #: Hold the scope's guard from start until the workspace is persisted.
    guard: bool = True
    #: How long to wait for the scope's guard (``None``: indefinitely).
    guard_wait: float | None = 300.0
    #: How long to wait for the Sandbox to become Ready (and for a snapshot).
    ready_timeout: float = 300.0

    def policy(self) -> dict[str, Any]:
        """The policy fields, to copy from options into a session state."""
        return {k: getattr(self, k) for k in RunPolicy.model_fields}


class AgentboxSandboxClientOptions(BaseSandboxClientOptions, RunPolicy):
    """Where and how the session's Sandbox runs.

    ``scope`` is the agentbox isolation scope (default: a Session scope of agent
    ``openai-agents`` and this framework session's id); sessions of one scope share its Sandbox
    and workspace. ``snapshot_restore`` is what a new Sandbox of the scope starts from
    (``Latest``: the scope's newest snapshot). See the module docs for ``on_delete``,
    ``workspace_persistence`` and ``port_access``.
    """

    type: Literal["agentbox"] = "agentbox"
    #: Container image (it needs ``sh`` and ``tar``).
    image: str
    #: Namespace of the Sandbox (default: the kubeconfig context's).
    namespace: str | None = None
    #: Isolation scope: an :class:`agentbox.Scope` (``Scope.for_user("coder", "alice")``), or
    #: its ``Scope.to_dict()`` form; either is checked here and kept as a ``Scope``.
    scope: Scope | dict[str, str] | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    #: Environment of the sandbox container.
    env: dict[str, str] = Field(default_factory=dict)
    #: Kubernetes resource requirements of the sandbox container.
    resources: dict[str, Any] | None = None
    runtime_class_name: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    #: Ports a server in the sandbox listens on, to be reached through
    #: ``resolve_exposed_port``.
    exposed_ports: tuple[int, ...] = ()
    snapshot_restore: Literal["Latest", "None"] = "Latest"
    #: What the sandbox may reach: an :class:`agentbox.Network` — ``Network("None")``
    #: (nothing), ``Network("All")``, or ``Network("Allowlist", [EgressAllow("10.0.0.0/8",
    #: [EgressPort(443)])])`` (only those addresses and ports) — or its dict form (a Sandbox's
    #: ``spec.network``); either is checked here and kept as a ``Network``. Unset (``None``):
    #: the cluster's default, the operator's ``--default-egress`` (Helm
    #: ``network.defaultEgress``), ``None`` unless the administrator changed it.
    network: Network | Mapping[str, Any] | None = None

    @field_validator("scope", mode="after")
    @classmethod
    def _scope(cls, value: Scope | dict[str, str] | None) -> Scope | None:
        # A dict is checked with the CRD's rules now, not at the first request.
        return scope_of(value)

    @field_validator("network", mode="plain")
    @classmethod
    def _network(cls, value: Any) -> Network | None:
        # Checked with the CRD's rules now, not when the first session creates its Sandbox.
        return network_of(value)

    @field_serializer("network")
    def _network_form(self, value: Network | Mapping[str, Any] | None) -> dict[str, Any] | None:
        # The dict form (the spec's), which the validator reads back: options make JSON
        # round trips in the framework's run state.
        network = network_of(value)
        return None if network is None else network_json(network)


def scope_of(value: Scope | Mapping[str, Any] | None) -> Scope | None:
    """The scope an option gives (pure): a ``Scope`` as it is, its dict form read (and checked:
    :class:`~agentbox.errors.InvalidRequestError`, a ``ValueError``), ``None`` for none.
    """
    if value is None or isinstance(value, Scope):
        return value
    return Scope.from_dict(value)


class AgentboxSandboxSessionState(SandboxSessionState, RunPolicy):
    """The serialisable state of a session: which Sandbox, made from what, and the last
    snapshot it persisted.
    """

    type: Literal["agentbox"] = "agentbox"
    namespace: str
    sandbox_name: str
    #: UID of the Sandbox the session last ran in (a re-created one has another).
    sandbox_uid: str = ""
    scope: dict[str, str]
    #: The Sandbox spec (JSON form) the session creates its Sandbox from.
    spec: dict[str, Any]
    #: The SandboxSnapshot the last ``persist_workspace`` took, if any.
    last_snapshot: str | None = None


def _port_name(port: int) -> str:
    return f"p{port}"


def build_spec(options: AgentboxSandboxClientOptions, manifest: Manifest) -> SandboxSpec:
    """The Sandbox spec for a session (pure): the options (their ``network`` as given; unset,
    the cluster's default), the manifest's root as the workspace root, and one named port per
    exposed port.
    """
    return SandboxSpec(
        image=options.image,
        image_pull_policy=options.image_pull_policy,
        env=dict(options.env),
        resources=options.resources,
        runtime_class_name=options.runtime_class_name,
        node_selector=dict(options.node_selector),
        workspace=WorkspaceSpec(root=manifest.root),
        snapshot=SnapshotPolicy(restore=options.snapshot_restore),
        network=network_of(options.network) or Network(),
        ports=[Port(_port_name(p), p) for p in options.exposed_ports],
    )


def choose_port_access(access: PortAccess, in_cluster: bool) -> PortAccess:
    """``auto`` becomes ``service`` inside a cluster (DNS and the Service proxy reach it) and
    ``port-forward`` outside (neither the pod network nor Services are reachable there).
    """
    if access != "auto":
        return access
    return "service" if in_cluster else "port-forward"


def can_skip_restore(ref: dict[str, str] | None, uid: str, restored_from: str | None) -> bool:
    """Whether the live workspace already is the referenced snapshot's (pure): the Sandbox is
    the one the snapshot was taken of (it was reattached), or the operator restored it from
    exactly that snapshot.
    """
    if ref is None:
        return False
    return ref.get("sandboxUid") == uid or (
        restored_from is not None and restored_from == ref.get("snapshot")
    )


class AgentboxSandboxSession(BaseSandboxSession):
    """A framework session on one agentbox Sandbox."""

    state: AgentboxSandboxSessionState

    def __init__(
        self, *, state: AgentboxSandboxSessionState, sandboxes: Sandboxes, sandbox: Sandbox
    ) -> None:
        self.state = state
        self._sandboxes = sandboxes
        self._sandbox = sandbox
        self._guard: Guard | None = None
        #: Whether this session's start got through: one that did not has nothing to persist.
        self._started = False
        self._forwards: dict[int, PortForward] = {}
        self._env: dict[str, str] | None = None

    @property
    def sandbox(self) -> Sandbox:
        """The agentbox Sandbox this session runs in."""
        return self._sandbox

    # --- lifecycle ------------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        # Serving first (a restore on the way needs the guard: the operator takes it), then the
        # guard. An idle timeout may suspend the sandbox in between; it does so while holding
        # the guard, so once the guard is ours the sandbox is seen suspended or stays serving.
        for _ in range(3):
            try:
                await self._sandbox.recover(self.state.ready_timeout)
            except ab_errors.AgentboxError as e:
                raise WorkspaceStartError(path=Path(self.state.manifest.root), cause=e) from e
            await self._acquire_guard()
            if self._guard is None or readiness((await self._sandbox.refresh()).obj) != "suspended":
                break
            await self._release_guard()
        self.state.sandbox_uid = str(self._sandbox.obj["metadata"].get("uid") or "")

    async def _acquire_guard(self) -> None:
        if not self.state.guard or self._guard is not None:
            return
        guard = self._sandbox.guard(wait=self.state.guard_wait)
        await guard.acquire()
        self._guard = guard

    async def _release_guard(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            with contextlib.suppress(ab_errors.AgentboxError):
                await guard.release()

    async def _after_start(self) -> None:
        self._started = True
        await super()._after_start()

    async def _persist_snapshot(self) -> None:
        # A session whose start failed (a Sandbox that never became Ready: an image that
        # cannot be pulled, a refused restore) ran nothing: persisting it would ask for a
        # snapshot of a sandbox that has no workspace to give, wait out `ready_timeout` for it
        # and leave it Pending. The last snapshot persisted, if any, stays the session's.
        if not self._started:
            return
        await super()._persist_snapshot()

    async def _after_stop(self) -> None:
        await self._release_guard()

    async def _shutdown_backend(self) -> None:
        await self._release_guard()
        forwards, self._forwards = self._forwards, {}
        for pf in forwards.values():
            await pf.close()

    def _should_compute_snapshot_fingerprint_on_persist(self) -> bool:
        # A reference names an immutable snapshot; fingerprinting would tar the workspace in
        # the pod for nothing. Tar persistence keeps the framework's drift check.
        return self.state.workspace_persistence == "tar"

    async def _can_skip_snapshot_restore_on_resume(self, *, is_running: bool) -> bool:
        if self.state.workspace_persistence == "tar":
            return await super()._can_skip_snapshot_restore_on_resume(is_running=is_running)
        ref = await self._stored_reference()
        return is_running and can_skip_restore(
            ref, self.state.sandbox_uid, self._sandbox.status.get("restoredFrom")
        )

    async def _stored_reference(self) -> dict[str, str] | None:
        with contextlib.suppress(Exception):
            stream = await self.state.snapshot.restore(dependencies=self.dependencies)
            try:
                head = stream.read(4096)
            finally:
                stream.close()
            if isinstance(head, bytes):
                return decode_reference(head)
        return None

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        # A reference is restored in the cluster (the workspace is replaced whole): clearing the
        # workspace file by file first would only cost requests.
        stream = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            head = stream.read(len(REFERENCE_MAGIC))
            if isinstance(head, bytes) and head == REFERENCE_MAGIC:
                await self.hydrate_workspace(io.BytesIO(head + _read_all(stream)))
                return
        finally:
            stream.close()
        await super()._restore_snapshot_into_workspace_on_resume()

    async def running(self) -> bool:
        """Whether the Sandbox serves commands in a live pod right now."""
        with contextlib.suppress(ab_errors.AgentboxError):
            await self._sandbox.refresh()
            return self._sandbox.phase == "Ready"
        return False

    # --- exec and files -------------------------------------------------------------------

    async def _manifest_env(self) -> dict[str, str]:
        if self._env is None:
            self._env = dict(await self.state.manifest.environment.resolve())
        return self._env

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv = [str(c) for c in command]
        env = await self._manifest_env()
        try:
            result = await in_pod(
                self._sandbox,
                lambda: self._sandbox.exec(argv, timeout=timeout, env=env or None),
                self.state.ready_timeout,
            )
        except ab_exec.ExecTimeoutError as e:
            raise ExecTimeoutError(command=argv, timeout_s=timeout, cause=e) from e
        except ab_errors.InvalidRequestError as e:
            raise ExecTransportError(command=argv, context={"reason": str(e)}, cause=e) from e
        except ab_errors.AgentboxError as e:
            raise ExecTransportError(command=argv, cause=e) from e
        if result.exit_code is None:
            raise ExecTransportError(
                command=argv,
                context={"reason": "missing_exit_code", "message": result.status_message},
            )
        return ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)

    def _in_root(self, path: Path) -> bool:
        root = PurePosixPath(self._sandbox.workspace_root)
        p = PurePosixPath(path.as_posix())
        return p == root or root in p.parents

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """A workspace file's content (``WorkspaceReadNotFoundError`` when missing)."""
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        target = self.normalize_path(path)
        try:
            if self._in_root(target):
                data = await in_pod(
                    self._sandbox,
                    lambda: self._sandbox.read(target.as_posix()),
                    self.state.ready_timeout,
                )
                return io.BytesIO(data)
        except ab_errors.RemoteFileNotFoundError as e:
            raise WorkspaceReadNotFoundError(path=path, cause=e) from e
        except ab_errors.AgentboxError as e:
            raise WorkspaceArchiveReadError(path=path, cause=e) from e
        # Outside the workspace (an extra path grant): plain cat in the pod.
        res = await self.exec("cat", "--", target.as_posix(), shell=False)
        if res.exit_code != 0:
            await self._raise_read_error_from_exec(
                path=path,
                workspace_path=target,
                command=("cat", "--", target.as_posix()),
                result=res,
            )
        return io.BytesIO(res.stdout)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Writes a workspace file (parents created)."""
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        blob = bytes(cast(bytes, payload))
        target = self.normalize_path(path, for_write=True)
        if self._in_root(target):
            try:
                await in_pod(
                    self._sandbox,
                    lambda: self._sandbox.write(target.as_posix(), blob),
                    self.state.ready_timeout,
                )
            except ab_errors.AgentboxError as e:
                raise WorkspaceArchiveWriteError(path=target, cause=e) from e
            return
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        try:
            res = await self._sandbox.exec(
                ["sh", "-c", script, "sh", target.as_posix()], stdin=blob
            )
        except ab_errors.AgentboxError as e:
            raise WorkspaceArchiveWriteError(path=target, cause=e) from e
        if res.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=target, context={"stderr": res.stderr_text(), "exit_code": res.exit_code}
            )

    # --- persistence ----------------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """A reference to a new SandboxSnapshot (default), or the workspace as a tar stream
        (``workspace_persistence="tar"``).
        """
        if self.state.workspace_persistence == "tar":
            return await self._persist_tar()
        return await self._persist_snapshot_reference()

    async def _persist_snapshot_reference(self) -> io.IOBase:
        root = Path(self._sandbox.workspace_root)
        try:
            # Under the run's own hold of the scope's guard (handed to the operator, kept
            # here): no other run can work in the scope between this run's last command and
            # the snapshot.
            snap = await self._sandbox.snapshot(
                wait=True, timeout=self.state.ready_timeout, guard=self._guard
            )
        except ab_errors.AgentboxError as e:
            raise WorkspaceArchiveReadError(
                path=root, context={"reason": "snapshot_failed"}, cause=e
            ) from e
        self.state.last_snapshot = snap.name
        ref = encode_reference(
            snap.name, self.state.namespace, self._sandbox.name, self.state.sandbox_uid
        )
        return io.BytesIO(ref)

    async def _persist_tar(self) -> io.IOBase:
        root = self._sandbox.workspace_root
        skip = {p.as_posix() for p in self._persist_workspace_skip_relpaths()} | {OPERATOR_STATE}
        # Returned open: the framework reads the archive after this returns.
        out = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as raw:
            try:
                code, err = await self._collect(["tar", "-c", "-f", "-", "-C", root, "."], raw)
            except ab_errors.AgentboxError as e:
                out.close()
                raise WorkspaceArchiveReadError(path=Path(root), cause=e) from e
            if code != 0:
                out.close()
                raise WorkspaceArchiveReadError(
                    path=Path(root), context={"exit_code": code, "stderr": err}
                )
            raw.seek(0)
            # busybox tar has no --exclude: the operator's state and the framework's skip
            # paths are dropped here, member by member.
            with (
                tarfile.open(fileobj=raw, mode="r|") as src,
                tarfile.open(fileobj=out, mode="w|") as dst,
            ):
                for member in src:
                    if not skipped(member.name, skip):
                        dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        out.seek(0)
        return cast(io.IOBase, out)

    async def _collect(self, argv: list[str], sink: IO[bytes]) -> tuple[int | None, str]:
        """Runs ``argv`` streaming its stdout into ``sink``; its exit code and stderr."""
        code: int | None = None
        err = bytearray()
        stream = await self._sandbox.exec_stream(argv)
        async with stream:
            async for ev in stream:
                if isinstance(ev, Output):
                    if ev.stream == "stdout":
                        sink.write(ev.data)
                    else:
                        err += ev.data
                elif isinstance(ev, Exit):
                    code = ev.exit_code
        return code, err.decode(errors="replace")

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Restores a reference in the cluster, or extracts a tar stream into the workspace."""
        head = data.read(len(REFERENCE_MAGIC))
        head = head.encode() if isinstance(head, str) else bytes(cast(bytes, head or b""))
        if head == REFERENCE_MAGIC:
            ref = decode_reference(head + _read_all(data))
            if ref is None:
                raise WorkspaceArchiveWriteError(
                    path=Path(self._sandbox.workspace_root),
                    context={"reason": "invalid_agentbox_reference"},
                )
            await self._restore_reference(ref)
            return
        await self._extract_tar(head, data)

    async def _restore_reference(self, ref: dict[str, str]) -> None:
        root = Path(self._sandbox.workspace_root)
        if can_skip_restore(ref, self.state.sandbox_uid, self._sandbox.status.get("restoredFrom")):
            return
        held = self._guard is not None
        await self._release_guard()  # the operator's restore takes the guard
        try:
            await self._sandbox.restore(ref["snapshot"], timeout=self.state.ready_timeout)
            await self._sandbox.recover(self.state.ready_timeout)
        except ab_errors.AgentboxError as e:
            raise WorkspaceArchiveWriteError(
                path=root,
                context={"reason": "restore_failed", "snapshot": ref["snapshot"]},
                cause=e,
            ) from e
        self.state.sandbox_uid = str(self._sandbox.obj["metadata"].get("uid") or "")
        self.state.last_snapshot = ref["snapshot"]
        if held:
            await self._acquire_guard()

    async def _extract_tar(self, head: bytes, data: io.IOBase) -> None:
        root = Path(self._sandbox.workspace_root)
        with tempfile.TemporaryFile() as archive:
            archive.write(head)
            while chunk := data.read(1 << 20):
                archive.write(chunk.encode() if isinstance(chunk, str) else chunk)
            archive.seek(0)
            try:
                with tarfile.open(fileobj=archive, mode="r:*") as tar:
                    validate_tarfile(tar, allow_external_symlink_targets=False)
            except UnsafeTarMemberError as e:
                raise WorkspaceArchiveWriteError(
                    path=root, context={"reason": e.reason, "member": e.member}, cause=e
                ) from e
            except (tarfile.TarError, OSError) as e:
                raise WorkspaceArchiveWriteError(path=root, cause=e) from e
            archive.seek(0)
            try:
                res = await self._sandbox.exec(
                    ["tar", "-x", "-f", "-", "-C", root.as_posix()], stdin=archive
                )
            except ab_errors.AgentboxError as e:
                raise WorkspaceArchiveWriteError(path=root, cause=e) from e
        if res.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=root, context={"exit_code": res.exit_code, "stderr": res.stderr_text()}
            )

    # --- ports ----------------------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        def unavailable(
            detail: str, cause: BaseException | None = None
        ) -> ExposedPortUnavailableError:
            return ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": BACKEND_ID, "detail": detail},
                cause=cause,
            )

        access = choose_port_access(
            self.state.port_access, bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        )
        # The status trails the spec and the pod: the operator records a new pod's IP shortly
        # after it serves. Wait for it a little rather than fail.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENDPOINT_WAIT
        while True:
            try:
                await self._sandbox.refresh()
            except ab_errors.AgentboxError as e:
                raise unavailable("sandbox_unreadable", e) from e
            ep = next((e for e in self._sandbox.endpoints if e.port == port), None)
            if ep is not None and (access != "pod-ip" or ep.pod_ip is not None):
                break
            if loop.time() >= deadline:
                raise unavailable("not_in_status_endpoints" if ep is None else "no_pod_ip")
            await asyncio.sleep(0.2)
        if access == "service":
            return ExposedPortEndpoint(host=ep.host, port=ep.port)
        if access == "pod-ip" and ep.pod_ip is not None:
            return ExposedPortEndpoint(host=ep.pod_ip, port=ep.port)
        pf = self._forwards.get(port)
        if pf is None or pf.pod != self._sandbox.pod_name:
            if pf is not None:
                await pf.close()
            pf = await self._sandbox.port_forward(port).start()
            self._forwards[port] = pf
        return ExposedPortEndpoint(host=pf.host, port=pf.local_port)


def skipped(member: str, skip: set[str]) -> bool:
    """Whether a tar member (``./a/b`` or ``a/b``) lies at or under a skipped path (pure)."""
    name = member[2:] if member.startswith("./") else member
    name = name.rstrip("/")
    return any(name == p or name.startswith(p + "/") for p in skip)


def _read_all(stream: io.IOBase) -> bytes:
    out = bytearray()
    while chunk := stream.read(1 << 20):
        out += chunk.encode() if isinstance(chunk, str) else chunk
    return bytes(out)


class AgentboxSandboxClient(BaseSandboxClient[AgentboxSandboxClientOptions]):
    """Makes, resumes and deletes agentbox-backed sessions.

    ``api_client`` (a ``kubernetes_asyncio`` ``ApiClient``) is used by every session when
    given; otherwise each session loads the in-cluster or kubeconfig credentials itself and
    closes its connection in :meth:`delete`.
    """

    backend_id = BACKEND_ID

    def __init__(
        self,
        *,
        api_client: Any = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        super().__init__()
        self._api_client = api_client
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )
        self._dependencies = dependencies

    def _connect(self, namespace: str | None) -> Sandboxes:
        return Sandboxes(namespace, api_client=self._api_client)

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: AgentboxSandboxClientOptions,
    ) -> SandboxSession:
        """Gets or creates the Sandbox of the options' scope (not waiting: ``start`` waits)."""
        if options is None:
            raise ValueError("AgentboxSandboxClient.create requires AgentboxSandboxClientOptions")
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        scope = scope_of(options.scope) or Scope.for_session(DEFAULT_AGENT, str(session_id))
        spec = build_spec(options, manifest)
        sandboxes = self._connect(options.namespace)
        try:
            sbx = await sandboxes.get_or_create(scope, spec)
            if sbx.workspace_root.rstrip("/") != manifest.root.rstrip("/"):
                raise ValueError(
                    f"sandbox {sbx.name} has workspace root {sbx.workspace_root}, the manifest "
                    f"{manifest.root}: use the same root, or another scope"
                )
        except BaseException:
            await sandboxes.close()
            raise
        state = AgentboxSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            exposed_ports=options.exposed_ports,
            namespace=sandboxes.namespace,
            sandbox_name=sbx.name,
            sandbox_uid=str(sbx.obj["metadata"].get("uid") or ""),
            scope=scope.to_dict(),
            spec=spec.to_dict(),
            **options.policy(),
        )
        inner = AgentboxSandboxSession(state=state, sandboxes=sandboxes, sandbox=sbx)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattaches to the session's Sandbox when it exists (its workspace is preserved);
        otherwise creates it again restored from the last snapshot the session persisted, or
        fresh when there is none.
        """
        if not isinstance(state, AgentboxSandboxSessionState):
            raise TypeError("AgentboxSandboxClient.resume expects an AgentboxSandboxSessionState")
        state.assert_path_grants_rebound()
        sandboxes = self._connect(state.namespace)
        try:
            sbx, preserved = await self._reattach_or_recreate(sandboxes, state)
        except BaseException:
            await sandboxes.close()
            raise
        if not preserved:
            state.workspace_root_ready = False
        inner = AgentboxSandboxSession(state=state, sandboxes=sandboxes, sandbox=sbx)
        # OS-level state (users, packages) lives in the container, not the workspace.
        inner._set_start_state_preserved(preserved, system=False)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    @staticmethod
    async def _reattach_or_recreate(
        sandboxes: Sandboxes, state: AgentboxSandboxSessionState
    ) -> tuple[Sandbox, bool]:
        scope = Scope.from_dict(state.scope)
        try:
            sbx = await sandboxes.open(state.sandbox_name)
            if not (sbx.obj.get("metadata") or {}).get("deletionTimestamp"):
                return sbx, True
            await sbx.delete(wait=True, timeout=state.ready_timeout)
        except ab_errors.NotFoundError:
            pass
        if state.last_snapshot:
            with contextlib.suppress(ab_errors.NotFoundError, ab_errors.SnapshotFailedError):
                try:
                    sbx = await sandboxes.create_restored(
                        scope, state.spec, state.last_snapshot, name=state.sandbox_name
                    )
                except ab_errors.ConflictError:  # re-created meanwhile by another harness
                    sbx = await sandboxes.open(state.sandbox_name)
                return sbx, True
        return await sandboxes.get_or_create(scope, state.spec), False

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Ends the run's hold on the Sandbox without losing what the next run resumes from:
        suspends it (default), deletes it once a snapshot of it exists, or keeps it running.
        """
        inner = session._inner
        if not isinstance(inner, AgentboxSandboxSession):
            raise TypeError("AgentboxSandboxClient.delete expects an AgentboxSandboxSession")
        try:
            await inner._shutdown_backend()
            policy = inner.state.on_delete
            if policy == "delete" and not inner.state.last_snapshot:
                policy = "suspend"  # nothing persisted: deleting would lose the workspace
            if policy in ("suspend", "delete"):
                await stop_unless_busy(inner.sandbox, policy, inner.state.ready_timeout)
        finally:
            await inner._sandboxes.close()
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        """Reads a persisted :class:`AgentboxSandboxSessionState`."""
        return self._deserialize_session_state_payload(payload, AgentboxSandboxSessionState)
