"""agentbox as the workspace of agentscope agents.

::

    from agentbox import Scope, SandboxSpec
    from agentbox.integrations.agentscope import AgentboxWorkspace

    async with AgentboxWorkspace(
        scope=Scope.for_user("coder", "alice"),
        spec=SandboxSpec(image="docker.io/library/busybox:1.37"),
        namespace="agents",
    ) as ws:
        tools = await ws.list_tools()  # Bash, Edit, Glob, Grep, Read, Write, in the sandbox

- :class:`AgentboxBackend` is agentscope's ``BackendBase`` on an agentbox Sandbox: commands
  over ``pods/exec`` with their real exit code (a timeout kills the command's process group and
  returns agentscope's ``-1`` / ``timed out``), files through the SDK (streamed, confined to the
  workspace). A command that could not start because the pod was being replaced runs again
  once the new pod serves.
- :class:`AgentboxWorkspace` is a ``SandboxedWorkspaceBase`` whose sandbox is the Sandbox of an
  agentbox scope: ``initialize`` gets or creates it and waits until it serves (resuming it when
  suspended), ``close`` suspends it by default — the pod goes, the workspace stays on its node
  (after a snapshot to object storage when the spec asks for ``snapshot.on_stop``).
- What the sandbox may reach is the spec's ``network``: ``Network("None")``, ``Network("All")``
  or an allowlist of address blocks and ports (``Network("Allowlist", [EgressAllow(...)])``);
  unset, the cluster's default (the operator's ``--default-egress``, ``None`` unless the
  administrator changed it). A bad one is refused when the workspace (or manager) is made.
- :class:`AgentboxWorkspaceManager` maps agentscope's ``IsolationPolicy`` onto scopes:
  ``PER_SESSION`` → a Session scope (agent, session), ``PER_AGENT`` (one workspace per user and
  agent) → a User scope (agent, user), ``PER_USER`` (one per user, across agents) → a User scope
  of the manager's ``app_agent``. Workspace ids name their scope (:func:`scope_workspace_id`),
  so a persisted binding finds the same Sandbox again in any process.

The in-sandbox MCP gateway of agentscope's sandboxed workspaces needs Python and network
access in the image; agentbox images need only ``sh`` and ``tar``, so this workspace starts
none (``add_mcp`` raises ``RuntimeError``, as agentscope's workspaces do without a gateway).
Skills are seeded with a tar stream and equipped with ``cp``/``mv`` instead of Python shims;
``add_skill_archive`` still needs ``python3`` in the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar
from urllib.parse import quote, unquote

from agentscope.app.workspace_manager import IsolationPolicy, WorkspaceManagerBase
from agentscope.tool import BackendBase, DirEntry, ExecResult
from agentscope.workspace._sandboxed_base import SandboxedWorkspaceBase
from agentscope.workspace._utils import DEFAULT_WORKSPACE_INSTRUCTIONS

from .. import errors as ab_errors
from .. import exec as ab_exec
from ..client import Sandbox, Sandboxes
from ..files import DirEntry as SandboxDirEntry
from ..scope import Scope, ScopeKind
from ..spec import SandboxSpec
from ._network import check_spec_network
from ._pods import in_pod, stop_unless_busy

__all__ = [
    "AgentboxBackend",
    "AgentboxWorkspace",
    "AgentboxWorkspaceManager",
    "parse_workspace_id",
    "scope_for",
    "scope_workspace_id",
]

T = TypeVar("T")
OnClose = Literal["suspend", "keep", "delete"]
#: Agent id of the ``PER_USER`` scopes (one workspace per user across agents).
DEFAULT_APP_AGENT = "agentscope"
_ID_PREFIX = "agentbox"


def scope_workspace_id(scope: Scope) -> str:
    """The workspace id of a scope: ``agentbox:<kind>[:<agent>[:<user or session>]]`` with the
    ids percent-encoded (pure, and reversed by :func:`parse_workspace_id`).
    """
    parts = [_ID_PREFIX, scope.kind.label_value]
    parts += [quote(v, safe="") for v in (scope.agent, scope.user or scope.session) if v]
    return ":".join(parts)


def parse_workspace_id(workspace_id: str) -> Scope:
    """The scope a workspace id names; ``ValueError`` for an id this module did not make."""
    parts = workspace_id.split(":")
    kinds = {k.label_value: k for k in ScopeKind}
    if len(parts) < 2 or parts[0] != _ID_PREFIX or parts[1] not in kinds:
        raise ValueError(
            f"workspace id {workspace_id!r} does not name an agentbox scope "
            "(make ids with scope_workspace_id or AgentboxWorkspaceManager.assign_workspace_id)"
        )
    kind = kinds[parts[1]]
    ids = [unquote(p) for p in parts[2:]]
    if kind is ScopeKind.SESSION and len(ids) == 2:
        return Scope.for_session(ids[0], ids[1])
    if kind is ScopeKind.USER and len(ids) == 2:
        return Scope.for_user(ids[0], ids[1])
    if kind is ScopeKind.AGENT and len(ids) == 1:
        return Scope.for_agent(ids[0])
    if kind is ScopeKind.GLOBAL and not ids:
        return Scope.for_global()
    raise ValueError(f"workspace id {workspace_id!r} has the wrong ids for a {kind.value} scope")


def scope_for(
    isolation: IsolationPolicy | str,
    *,
    user_id: str,
    agent_id: str,
    session_id: str,
    app_agent: str = DEFAULT_APP_AGENT,
) -> Scope:
    """The agentbox scope of an agentscope isolation grain (pure). ``PER_AGENT`` is agentscope's
    one workspace per (user, agent) pair: an agentbox User scope.
    """
    agent = agent_id or app_agent
    policy = IsolationPolicy(isolation)
    if policy is IsolationPolicy.PER_SESSION:
        return Scope.for_session(agent, session_id)
    if policy is IsolationPolicy.PER_USER:
        return Scope.for_user(app_agent, user_id)
    return Scope.for_user(agent, user_id)


def _skill_dirs(paths: list[str]) -> list[tuple[str, str]]:
    """The skill directories (those with a ``SKILL.md``) and their names."""
    return [
        (p, os.path.basename(os.path.abspath(p)))
        for p in paths
        if os.path.isfile(os.path.join(p, "SKILL.md"))
    ]


def not_found(path: str) -> ab_errors.RemoteFileNotFoundError:
    """The error of a read of ``path`` where no regular file is (pure): a ``FileNotFoundError``
    (and agentbox's :class:`~agentbox.errors.RemoteFileNotFoundError`) that says so.
    """
    return ab_errors.RemoteFileNotFoundError(f"not found in the sandbox: {path}")


def _dir_entry(e: SandboxDirEntry) -> DirEntry:
    is_dir = e.kind == "dir"
    return DirEntry(
        name=e.name, is_dir=is_dir, size_bytes=None if is_dir else e.size, mtime=float(e.mtime)
    )


class AgentboxBackend(BackendBase):
    """agentscope's ``BackendBase`` on an agentbox Sandbox. Paths in the workspace go through
    the SDK (confined to the workspace, symlinks that lead out refused in the pod); paths
    elsewhere in the container through ``sh``.
    """

    def __init__(self, sandbox: Sandbox, *, recover_timeout: float = 120.0) -> None:
        self.sandbox = sandbox
        self._recover_timeout = recover_timeout

    def _in_root(self, path: str) -> bool:
        root = self.sandbox.workspace_root.rstrip("/") or "/"
        p = posixpath.normpath(path)
        return p == root or p.startswith(root + "/")

    async def _run(self, op: Callable[[], Awaitable[T]]) -> T:
        return await in_pod(self.sandbox, op, self._recover_timeout)

    async def exec_shell(
        self, command: list[str], *, cwd: str | None = None, timeout: float | None = None
    ) -> ExecResult:
        """Runs an argv in the sandbox (in ``cwd``, default the workspace root); ``-1`` with
        ``timed out`` when the timeout passed (the command was killed).
        """
        try:
            r = await self._run(lambda: self.sandbox.exec(command, cwd=cwd, timeout=timeout))
        except ab_exec.ExecTimeoutError:
            return ExecResult(exit_code=-1, stdout=b"", stderr=b"timed out")
        except ab_errors.CommandNotStartedError as e:
            # The program could not be started (not found, not executable): a shell's 127.
            return ExecResult(exit_code=127, stdout=b"", stderr=str(e).encode())
        except ab_errors.InvalidRequestError as e:
            return ExecResult(exit_code=-1, stdout=b"", stderr=str(e).encode())
        except ab_errors.AgentboxError as e:
            return ExecResult(exit_code=-1, stdout=b"", stderr=f"agentbox: {e}".encode())
        return ExecResult(
            exit_code=-1 if r.exit_code is None else r.exit_code,
            stdout=r.stdout,
            stderr=r.stderr if r.exit_code is not None else r.status_message.encode(),
        )

    async def read_file(self, path: str) -> bytes:
        """A file's bytes; ``FileNotFoundError`` saying "not found" when there is no regular
        file at ``path``, as agentscope's own backends say it (its tools show the message).
        """
        if self._in_root(path):
            try:
                return await self._run(lambda: self.sandbox.read(path))
            except ab_errors.RemoteFileNotFoundError as e:
                raise not_found(path) from e
        # Not through exec_shell, which turns every SDK error into a result: a read whose
        # output was cut on the way raises OutputCutError rather than look like a missing file.
        r = await self._run(lambda: self.sandbox.exec(["cat", "--", path]))
        if not r.ok:
            err = r.stderr.decode(errors="replace").strip()
            if "No such file" in err or "Is a directory" in err:
                raise not_found(path)
            raise FileNotFoundError(f"cannot read {path}: {err}")
        return r.stdout

    async def write_file(self, path: str, data: bytes) -> None:
        """Writes a file atomically, creating parent directories."""
        if self._in_root(path):
            await self._run(lambda: self.sandbox.write(path, data))
            return
        await self._write_outside(path, data)

    async def write_stream(self, path: str, stream: AsyncIterator[bytes]) -> None:
        """Streams bytes into a file (constant memory in the workspace)."""
        if self._in_root(path):
            # A stream can be consumed once: no retry after a pod replacement.
            await self.sandbox.write(path, stream)
            return
        await self._write_outside(path, b"".join([c async for c in stream]))

    async def _write_outside(self, path: str, data: bytes) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        r = await self._run(lambda: self.sandbox.exec(["sh", "-c", script, "sh", path], stdin=data))
        if r.exit_code != 0:
            raise RuntimeError(f"write to {path!r} failed: {r.stderr_text()}")

    async def file_exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        if self._in_root(path):
            return await self._run(lambda: self.sandbox.exists(path))
        return await super().file_exists(path)

    async def stat(self, path: str) -> DirEntry | None:
        """Type, size and mtime of ``path``, or ``None`` when missing."""
        if not self._in_root(path):
            return await super().stat(path)
        try:
            return _dir_entry(await self._run(lambda: self.sandbox.stat(path)))
        except ab_errors.RemoteFileNotFoundError:
            return None

    async def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""
        if not self._in_root(path):
            return await super().is_dir(path)
        entry = await self.stat(path)
        return entry is not None and entry.is_dir

    async def stat_mtime(self, path: str) -> float | None:
        """The modification time of ``path``, or ``None`` when missing."""
        if not self._in_root(path):
            return await super().stat_mtime(path)
        entry = await self.stat(path)
        return None if entry is None else entry.mtime

    async def scandir(self, path: str) -> list[DirEntry]:
        """One directory level with metadata (``[]`` when missing)."""
        if not self._in_root(path):
            return await super().scandir(path)
        try:
            return [_dir_entry(e) for e in await self._run(lambda: self.sandbox.ls(path))]
        except ab_errors.RemoteFileNotFoundError:
            return []

    async def list_dir(self, path: str, *, recursive: bool = False) -> list[str]:
        """Child names, or with ``recursive`` the paths of all files below ``path``."""
        if recursive or not self._in_root(path):
            # `find -type f -print0` works with busybox too; only -printf does not.
            return await super().list_dir(path, recursive=recursive)
        return [e.name for e in await self.scandir(path)]

    async def delete_path(self, path: str) -> None:
        """Removes a file or a tree (nothing when missing)."""
        if not self._in_root(path):
            await super().delete_path(path)
            return
        with contextlib.suppress(ab_errors.RemoteFileNotFoundError):
            await self._run(lambda: self.sandbox.rm(path, recursive=True))


class AgentboxWorkspace(SandboxedWorkspaceBase):
    """An agentscope workspace in the agentbox Sandbox of ``scope``: it survives the process
    and the pod (the workspace lives on its node, and in snapshots), and two scopes never see
    each other's files.

    ``spec`` shapes the Sandbox (image, resources, ``snapshot.on_stop``...; its scope is set to
    ``scope``), and its ``network`` says what the sandbox may reach: ``Network("None")``
    (nothing), ``Network("All")``, or ``Network("Allowlist", [EgressAllow("10.0.0.0/8",
    [EgressPort(443)])])`` (only those addresses and ports). Left unset, the cluster's default
    applies: the operator's ``--default-egress`` (Helm ``network.defaultEgress``), ``None``
    unless the administrator changed it; a spec made from a template takes the template's and
    sets none. The network is checked here, before any request (``InvalidRequestError``, a
    ``ValueError``, naming the cause). ``on_close``: ``suspend`` (default; the pod goes, the
    workspace stays), ``keep`` (the pod keeps running) or ``delete`` (the Sandbox and its
    workspace go; snapshots stay).
    """

    _gateway_home = "/tmp/.agentscope"

    def __init__(
        self,
        *,
        scope: Scope,
        spec: SandboxSpec | None = None,
        namespace: str | None = None,
        api_client: Any = None,
        on_close: OnClose = "suspend",
        ready_timeout: float = 300.0,
        workspace_id: str | None = None,
        instructions: str = DEFAULT_WORKSPACE_INSTRUCTIONS,
        skill_paths: list[str] | None = None,
    ) -> None:
        if not isinstance(scope, Scope):
            raise ab_errors.InvalidRequestError(
                f"scope must be a Scope, not {type(scope).__name__}"
            )
        if on_close not in ("suspend", "keep", "delete"):
            raise ab_errors.InvalidRequestError(
                f"on_close must be suspend, keep or delete: {on_close!r}"
            )
        spec = spec if spec is not None else SandboxSpec(image="docker.io/library/busybox:1.37")
        check_spec_network(spec)
        super().__init__(
            workspace_id=workspace_id or scope_workspace_id(scope), skill_paths=skill_paths
        )
        self.scope = scope
        self.spec = spec
        self.workdir = self.spec.workspace.root.rstrip("/") or "/"
        self.gateway_port = 0
        self.on_close: OnClose = on_close
        self.ready_timeout = ready_timeout
        self.instructions = instructions.format(backend="agentbox", workdir=self.workdir)
        self._sandboxes = Sandboxes(namespace, api_client=api_client)
        self._sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        """The agentbox Sandbox (after :meth:`initialize`)."""
        if self._sandbox is None:
            raise RuntimeError("AgentboxWorkspace is not initialized")
        return self._sandbox

    async def _provision_backend(self) -> None:
        try:
            sbx = await self._sandboxes.get_or_create(self.scope, self.spec)
            # Raises as soon as the start stalls (an image that cannot be pulled, ...), not
            # at `ready_timeout`; the Sandbox is left as it is, Stalled, for whoever looks.
            await sbx.recover(self.ready_timeout)
        except BaseException:
            # No workspace to close later: the API client goes now (made anew on a retry).
            await self._sandboxes.close()
            raise
        self._sandbox = sbx
        self.workdir = sbx.workspace_root.rstrip("/") or "/"
        self._backend = AgentboxBackend(sbx, recover_timeout=self.ready_timeout)

    async def _teardown_backend(self) -> None:
        sbx, self._sandbox = self._sandbox, None
        try:
            if sbx is not None and self.on_close in ("suspend", "delete"):
                how: Literal["suspend", "delete"] = (
                    "suspend" if self.on_close == "suspend" else "delete"
                )
                await stop_unless_busy(sbx, how, self.ready_timeout)
        except ab_errors.AgentboxError:
            pass  # the contract: teardown never raises
        finally:
            await self._sandboxes.close()

    async def _setup_mcp_gateway(self) -> None:
        # No in-sandbox gateway (it needs Python and network in the image): see the module
        # docs. ``_gateway`` stays None, so MCP calls fail with the base class's message.
        return

    async def _ensure_workspace_layout(self) -> None:
        backend = self.get_backend()
        dirs = [self._data_dir, self._skills_dir, self._sessions_dir]
        r = await backend.exec_shell(["mkdir", "-p", "--", *dirs])
        if not r.ok():
            raise RuntimeError(f"cannot create the workspace layout: {r.stderr.decode()}")

    async def _migrate_skill_layout(self) -> None:
        # The pre-partition skills layout predates this backend: nothing to migrate.
        return

    async def _setup_skills(self) -> None:
        """Seeds ``skill_paths`` into the seed template once, as a tar stream."""
        if not self.skill_paths or self._sandbox is None:
            return
        seed = self._skill_seed_dir
        if await self.get_backend().list_dir(seed):
            return
        for path, name in await asyncio.to_thread(_skill_dirs, self.skill_paths):
            await self._sandbox.upload_dir(path, posixpath.join(seed, name))

    async def _equip_partition(self, agent_id: str | None) -> str:
        partition = self._skill_partition(agent_id)
        if partition in self._equipped_partitions:
            return partition
        # Copy the seed to a staging name, then rename: a concurrent first touch loses the
        # rename and drops its copy (as agentscope's own shim does).
        script = (
            '[ -d "$2" ] && exit 0; mkdir -p "$(dirname "$2")"; s="$2.equipping-$$"; '
            'if [ -d "$1" ]; then cp -R "$1" "$s"; else mkdir -p "$s"; fi; '
            'mv -T "$s" "$2" 2>/dev/null || rm -rf "$s"; [ -d "$2" ]'
        )
        r = await self.get_backend().exec_shell(
            ["sh", "-c", script, "sh", self._skill_seed_dir, partition]
        )
        if not r.ok():
            raise RuntimeError(
                f"Failed to equip skill partition {partition!r}: {r.stderr.decode()}"
            )
        self._equipped_partitions.add(partition)
        return partition

    async def get_instructions(self) -> str:
        """The system-prompt fragment of this workspace."""
        return self.instructions


class AgentboxWorkspaceManager(WorkspaceManagerBase):
    """Hands out :class:`AgentboxWorkspace` instances, one per agentbox scope, under an
    agentscope isolation policy (see the module docs for the mapping). Workspaces are cached
    per id; ``close``/``close_all`` (and leaving ``async with``) close them, which suspends their
    Sandboxes by default. ``spec`` shapes every workspace's Sandbox, its ``network`` too (see
    :class:`AgentboxWorkspace`: unset, the cluster's default), checked here before any request.
    """

    def __init__(
        self,
        *,
        spec: SandboxSpec,
        isolation: IsolationPolicy | str = IsolationPolicy.PER_AGENT,
        namespace: str | None = None,
        api_client: Any = None,
        app_agent: str = DEFAULT_APP_AGENT,
        on_close: OnClose = "suspend",
        ready_timeout: float = 300.0,
        skill_paths: list[str] | None = None,
    ) -> None:
        check_spec_network(spec)
        super().__init__(isolation=IsolationPolicy(isolation))
        self.spec = spec
        self.namespace = namespace
        self.app_agent = app_agent
        self.on_close: OnClose = on_close
        self.ready_timeout = ready_timeout
        self.skill_paths = list(skill_paths or [])
        self._api_client = api_client
        self._cache: dict[str, AgentboxWorkspace] = {}
        self._lock = asyncio.Lock()

    async def assign_workspace_id(self, *, user_id: str, agent_id: str, session_id: str) -> str:
        """The id of the scope the isolation policy gives this user, agent and session: the
        same for every process, so no binding needs storing or reserving.
        """
        return scope_workspace_id(
            scope_for(
                self._isolation,
                user_id=user_id,
                agent_id=agent_id,
                session_id=session_id,
                app_agent=self.app_agent,
            )
        )

    async def get_workspace(
        self,
        user_id: str,
        agent_id: str,
        session_id: str,
        workspace_id: str | None = None,
    ) -> AgentboxWorkspace:
        """An initialised workspace: the one ``workspace_id`` names, else the one the isolation
        policy assigns.
        """
        if not workspace_id:
            workspace_id = await self.assign_workspace_id(
                user_id=user_id, agent_id=agent_id, session_id=session_id
            )
        scope = parse_workspace_id(workspace_id)
        async with self._lock:
            ws = self._cache.get(workspace_id)
            if ws is None:
                ws = AgentboxWorkspace(
                    scope=scope,
                    spec=self.spec,
                    namespace=self.namespace,
                    api_client=self._api_client,
                    on_close=self.on_close,
                    ready_timeout=self.ready_timeout,
                    workspace_id=workspace_id,
                    skill_paths=self.skill_paths,
                )
                await ws.initialize()
                self._cache[workspace_id] = ws
            return ws

    async def close(self, workspace_id: str) -> None:
        """Closes and forgets one workspace."""
        async with self._lock:
            ws = self._cache.pop(workspace_id, None)
        if ws is not None:
            await ws.close()

    async def close_all(self) -> None:
        """Closes every workspace this manager handed out."""
        async with self._lock:
            workspaces = list(self._cache.values())
            self._cache.clear()
        await asyncio.gather(*(ws.close() for ws in workspaces), return_exceptions=True)
