"""The async core: :class:`Sandboxes` (get or create the Sandbox of a scope, open, list) and
:class:`Sandbox` (wait until Ready, exec, sessions, files, lifecycle, snapshots, the scope's
guard) — the Python counterpart of the Rust crate's ``agentbox_client::client``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import _wire
from . import exec as _exec
from . import labels as _labels
from . import snapshots as _snapshots
from ._kube import (
    GROUP,
    VERSION,
    Kube,
    default_namespace,
    load_api_client,
    pod_path,
    pools_path,
    sandboxes_path,
    snapshots_path,
    templates_path,
)
from ._watch import wait_gone, watch_until
from .errors import (
    ConflictError,
    GuardError,
    InvalidRequestError,
    NotFoundError,
    SandboxFailedError,
    SandboxNotDeletedError,
    SandboxNotReadyError,
    SandboxSuspendedError,
    ScopeMismatchError,
    SnapshotFailedError,
)
from .exec import ExecResult, ExecStream, StdinSource
from .files import READ_CAP, DirEntry, Workspace
from .guard import Guard, GuardConfig
from .ports import Endpoint, PortForward
from .scope import Scope
from .session import Session
from .snapshots import Snapshot, failing_condition
from .spec import SandboxSpec

__all__ = ["EndedScope", "Sandbox", "Sandboxes"]

Readiness = Literal["ready", "failed", "suspended", "waiting"]


def stalled(obj: Mapping[str, Any]) -> bool:
    """Whether a Sandbox's ``Stalled`` condition is True for its current spec (pure): its start
    was refused for a reason waiting will not fix (another scope's snapshot without the
    namespace's consent, a refused or missing snapshot), so waiting for Ready is pointless until
    something changes.
    """
    generation = (obj.get("metadata") or {}).get("generation")
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Stalled" and c.get("status") == "True":
            observed = c.get("observedGeneration")
            stale = isinstance(observed, int) and isinstance(generation, int)
            return not (stale and observed < generation)
    return False


def readiness(obj: Mapping[str, Any]) -> Readiness:
    """What a Sandbox's state means for a caller waiting for it (pure): ``ready``; ``failed``
    (it will not become Ready until its spec changes, or its start is ``Stalled``: refused until
    something changes); ``suspended`` by its spec (waiting would not help); else ``waiting``.
    """
    # Suspended by the spec wins: a phase still Ready is about to change.
    if ((obj.get("spec") or {}).get("lifecycle") or {}).get("mode") == "Suspended":
        return "suspended"
    if stalled(obj):
        return "failed"
    status = obj.get("status") or {}
    phase = status.get("phase")
    observed = status.get("observedGeneration")
    generation = (obj.get("metadata") or {}).get("generation")
    if isinstance(observed, int) and isinstance(generation, int) and observed < generation:
        return "waiting"  # a status from before the latest spec change
    if phase == "Ready":
        return "ready"
    if phase == "Failed":
        return "failed"
    return "waiting"


def serving(obj: Mapping[str, Any], pod: Mapping[str, Any] | None) -> bool:
    """Whether a Sandbox serves commands in its live pod (pure): Ready for its current spec,
    and its workspace initialised in exactly that pod, which is not being deleted. A status
    still Ready from a pod that was just deleted is not serving.
    """
    if readiness(obj) != "ready" or pod is None:
        return False
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    ws = (obj.get("status") or {}).get("workspace") or {}
    return bool(meta.get("uid")) and ws.get("initializedPodUid") == meta.get("uid")


@dataclass(frozen=True)
class EndedScope:
    """What :meth:`Sandboxes.end_scope` did."""

    #: The Sandboxes deleted (gone when it returned).
    sandboxes: tuple[str, ...]
    #: The SandboxSnapshots deleted (a ``Delete`` one's stored tarball goes with it).
    deleted_snapshots: tuple[str, ...]
    #: The Ready SandboxSnapshots kept (the newest ``keep``), oldest first.
    kept_snapshots: tuple[str, ...]


def snapshots_to_keep(lineage: Sequence[Snapshot], keep: int) -> builtins.list[Snapshot]:
    """The snapshots of a lineage (oldest first) that ending its scope keeps (pure): the newest
    ``keep`` Ready ones. Unfinished and failed ones never count: nothing would finish them.
    """
    ready = [s for s in lineage if s.phase == "Ready"]
    return ready[len(ready) - keep :] if keep > 0 else []


def _spec_dict(spec: SandboxSpec | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, SandboxSpec):
        return spec.to_dict()
    if isinstance(spec, Mapping):
        return dict(spec)
    raise InvalidRequestError(f"spec must be a SandboxSpec or a mapping, not {type(spec).__name__}")


class Sandboxes:
    """The Sandboxes of one namespace.

    ``namespace`` defaults to the kubeconfig context's (or the service account's) namespace.
    Without ``api_client`` (a ``kubernetes_asyncio`` ``ApiClient``) one is made from the
    in-cluster service account or the kubeconfig on first use, and closed by :meth:`close` or
    at the end of ``async with``.
    """

    def __init__(self, namespace: str | None = None, api_client: Any = None) -> None:
        self.namespace = namespace or default_namespace()
        self._api_client = api_client
        self._owned = api_client is None
        self._kube: Kube | None = Kube(api_client) if api_client is not None else None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Sandboxes:
        await self.kube()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def kube(self) -> Kube:
        """The API connection (made on first use)."""
        if self._kube is None:
            async with self._lock:
                if self._kube is None:
                    self._kube = Kube(await load_api_client())
        return self._kube

    async def close(self) -> None:
        """Closes the API client if this object made it."""
        if self._kube is not None and self._owned:
            await self._kube.close()
            self._kube = None

    def _handle(self, obj: dict[str, Any]) -> Sandbox:
        return Sandbox(self, obj)

    async def get_or_create(self, scope: Scope, spec: SandboxSpec | Mapping[str, Any]) -> Sandbox:
        """The Sandbox of ``scope``: created from ``spec`` (its scope set to ``scope``) under
        the scope's deterministic name, or the existing one if someone created it first — two
        racing callers get the same Sandbox. A suspended one is resumed (an idle sandbox comes
        back; :meth:`Sandbox.wait_ready` waits for its new pod).
        """
        if not isinstance(scope, Scope):
            raise InvalidRequestError(f"scope must be a Scope, not {type(scope).__name__}")
        body_spec = _spec_dict(spec)
        body_spec["scope"] = scope.to_dict()
        name = _labels.sandbox_name_for_scope(scope)
        kube = await self.kube()
        template = (body_spec.get("templateRef") or {}).get("name")
        # Fail now, not after a wait for Ready: a sandbox would wait for its template.
        if template and await kube.get_opt(templates_path(self.namespace, template)) is None:
            raise NotFoundError(f"sandboxtemplate {self.namespace}/{template} not found")
        try:
            obj = await kube.call(
                "POST", sandboxes_path(self.namespace), body=self._object(name, scope, body_spec)
            )
        except ConflictError:
            obj = await kube.call("GET", sandboxes_path(self.namespace, name))
        # The name is a hash of the scope; another scope under it was made by hand.
        if Scope.from_dict((obj.get("spec") or {}).get("scope") or {}) != scope:
            raise ScopeMismatchError(f"sandbox {name} exists with a different scope")
        handle = self._handle(obj)
        if ((obj.get("spec") or {}).get("lifecycle") or {}).get("mode") == "Suspended":
            await handle.resume()
        return handle

    async def templates(self) -> builtins.list[dict[str, Any]]:
        """The namespace's SandboxTemplates, as the API has them."""
        kube = await self.kube()
        data = await kube.call("GET", templates_path(self.namespace))
        return list(data.get("items") or [])

    async def pools(self) -> builtins.list[dict[str, Any]]:
        """The namespace's SandboxPools (warm pods of a template), as the API has them."""
        kube = await self.kube()
        data = await kube.call("GET", pools_path(self.namespace))
        return list(data.get("items") or [])

    @staticmethod
    def _object(name: str, scope: Scope, spec: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": _labels.scope_labels(scope)}
        ann = _labels.scope_annotations(scope)
        if ann:
            meta["annotations"] = ann
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": meta,
            "spec": spec,
        }

    async def open(self, name: str) -> Sandbox:
        """An existing Sandbox by name (:class:`~agentbox.errors.NotFoundError` if none)."""
        kube = await self.kube()
        obj = await kube.get_opt(sandboxes_path(self.namespace, name))
        if obj is None:
            raise NotFoundError(f"sandbox {self.namespace}/{name} not found")
        return self._handle(obj)

    async def open_scope(self, scope: Scope) -> Sandbox:
        """The Sandbox of a scope, without creating it."""
        return await self.open(_labels.sandbox_name_for_scope(scope))

    async def list(
        self, selector: str | None = None, *, scope: Scope | None = None
    ) -> builtins.list[Sandbox]:
        """Sandboxes, optionally by label selector or of one scope."""
        if scope is not None:
            selector = (
                _labels.scope_selector(scope)
                if selector is None
                else f"{selector},{_labels.scope_selector(scope)}"
            )
        kube = await self.kube()
        query = {"labelSelector": selector} if selector else None
        data = await kube.call("GET", sandboxes_path(self.namespace), query=query)
        return [self._handle(o) for o in data.get("items") or []]

    async def create_restored(
        self,
        scope: Scope,
        spec: SandboxSpec | Mapping[str, Any],
        snapshot: str,
        *,
        name: str | None = None,
    ) -> Sandbox:
        """Creates a Sandbox (the scope's name unless ``name``) whose fresh workspace is
        restored from the Ready snapshot ``snapshot`` (``snapshot.restore: Named``). A 409
        (:class:`~agentbox.errors.ConflictError`) if the name is taken. A snapshot of another
        scope is restored only where the namespace allows it (annotation
        ``agentbox.dev/allow-cross-scope-restore``); otherwise the Sandbox's ``wait_ready``
        fails with reason ``CrossScopeRestore``.
        """
        snap = await self.get_snapshot(snapshot)
        if snap.phase != "Ready":
            raise SnapshotFailedError(
                snapshot, snap.phase, "NotReady", "only a Ready snapshot can be restored"
            )
        body_spec = _spec_dict(spec)
        body_spec["scope"] = scope.to_dict()
        body_spec["snapshot"] = {
            **(body_spec.get("snapshot") or {}),
            "restore": "Named",
            "name": snapshot,
        }
        kube = await self.kube()
        obj = await kube.call(
            "POST",
            sandboxes_path(self.namespace),
            body=self._object(name or _labels.sandbox_name_for_scope(scope), scope, body_spec),
        )
        return self._handle(obj)

    async def get_snapshot(self, name: str) -> Snapshot:
        """A SandboxSnapshot by name."""
        return await _snapshots.get(await self.kube(), self.namespace, name)

    async def wait_snapshot(self, name: str, timeout: float = 600.0) -> Snapshot:
        """Waits until a snapshot is Ready (:class:`~agentbox.errors.SnapshotFailedError` if it
        fails or the timeout passes).
        """
        return await _snapshots.wait(await self.kube(), self.namespace, name, timeout)

    async def snapshots(self, scope: Scope) -> builtins.list[Snapshot]:
        """A scope's lineage: its snapshots, oldest first."""
        return await _snapshots.lineage(
            await self.kube(), self.namespace, _labels.scope_selector(scope)
        )

    async def end_scope(self, scope: Scope, *, keep: int = 0, timeout: float = 300.0) -> EndedScope:
        """Ends a scope for good: deletes its Sandboxes and waits until they are gone (their
        pods and workspaces go; one whose spec asks for ``snapshot.onStop`` takes that snapshot
        first), then deletes its SandboxSnapshots but the newest ``keep`` Ready ones. A
        snapshot's stored tarball goes with it under ``deletionPolicy: Delete`` (the default;
        the operator removes it, then the object, shortly after this returns) and stays in the
        store under ``Retain``. The scope's guard Lease stays (it holds no
        data, and it keeps the fencing tokens rising should the scope be used again).

        Call it once the scope's runs are over: a run still using the scope loses its sandbox.
        Calling it again is harmless. Raises
        :class:`~agentbox.errors.SandboxNotDeletedError` when a Sandbox still exists after
        ``timeout`` seconds (its snapshots are then left as they were).
        """
        if not isinstance(scope, Scope):
            raise InvalidRequestError(f"scope must be a Scope, not {type(scope).__name__}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InvalidRequestError(f"keep must be a whole number of snapshots, not {keep!r}")
        kube = await self.kube()
        doomed = await self.list(scope=scope)
        for sbx in doomed:
            with contextlib.suppress(NotFoundError):
                await kube.call("DELETE", sbx._path())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for sbx in doomed:
            if not await wait_gone(kube, sbx._path(), max(0.0, deadline - loop.time())):
                raise SandboxNotDeletedError(
                    sbx.name, "Terminating", "Timeout", f"still exists after {timeout}s"
                )
        # Listed once the sandboxes are gone: an on-stop snapshot taken on the way is in it.
        lineage = await self.snapshots(scope)
        kept = snapshots_to_keep(lineage, keep)
        kept_names = {s.name for s in kept}
        deleted = [s.name for s in lineage if s.name not in kept_names]
        for name in deleted:
            with contextlib.suppress(NotFoundError):
                await kube.call("DELETE", snapshots_path(self.namespace, name))
        return EndedScope(
            sandboxes=tuple(s.name for s in doomed),
            deleted_snapshots=tuple(deleted),
            kept_snapshots=tuple(s.name for s in kept),
        )

    def guard(
        self, scope: Scope, *, wait: float | None = None, config: GuardConfig | None = None
    ) -> Guard:
        """The execution guard of a scope, acquired by ``async with`` (or
        :meth:`Guard.acquire`); see :class:`~agentbox.Guard`.
        """
        key = _labels.scope_key(scope)
        return Guard(
            self.kube,
            self.namespace,
            _labels.lease_name(key),
            _labels.scope_labels(scope),
            config,
            wait,
        )


class Sandbox:
    """One Sandbox: exec, sessions, files, lifecycle, snapshots and its scope's guard. Get one
    from :class:`Sandboxes`. Paths are relative to the workspace root (or absolute under it);
    commands run in the workspace root unless ``cwd`` says otherwise.
    """

    def __init__(self, sandboxes: Sandboxes, obj: dict[str, Any]) -> None:
        self._sandboxes = sandboxes
        #: The Sandbox object as last read.
        self.obj = obj

    @property
    def name(self) -> str:
        """The Sandbox's name."""
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        """Its namespace."""
        return self._sandboxes.namespace

    @property
    def spec(self) -> SandboxSpec:
        """The spec as last read."""
        return SandboxSpec.from_dict(self.obj.get("spec") or {})

    @property
    def scope(self) -> Scope:
        """The isolation scope."""
        return Scope.from_dict((self.obj.get("spec") or {}).get("scope") or {})

    @property
    def status(self) -> Mapping[str, Any]:
        """The status as last read (``phase``, ``conditions``, ``podName``, ...)."""
        return self.obj.get("status") or {}

    @property
    def phase(self) -> str | None:
        """The phase as last read."""
        return self.status.get("phase")

    @property
    def pod_name(self) -> str:
        """The sandbox's pod (from status, else the deterministic name)."""
        return str(self.status.get("podName") or _labels.pod_name(self.name))

    @property
    def endpoints(self) -> builtins.list[Endpoint]:
        """Where the ports of ``spec.ports`` are reached, as last read (``status.endpoints``):
        the Service's cluster DNS name and, while the pod runs, its IP. :meth:`refresh` to see
        a new pod's IP.
        """
        return [Endpoint.from_status(e) for e in self.status.get("endpoints") or []]

    def port_forward(self, port: int, *, local_port: int = 0) -> PortForward:
        """A listener on ``127.0.0.1`` (``local_port``, or one the system picks) whose
        connections reach ``port`` of the sandbox's pod through the API server — for a harness
        outside the cluster. Use it with ``async with``; ``.local_port`` says where it listens.
        """
        return PortForward(
            self._sandboxes.kube, self.namespace, self.pod_name, port, local_port=local_port
        )

    @property
    def workspace_root(self) -> str:
        """The workspace root in the container."""
        return str(
            ((self.obj.get("spec") or {}).get("workspace") or {}).get("root") or "/workspace"
        )

    async def _kube(self) -> Kube:
        return await self._sandboxes.kube()

    def _path(self) -> str:
        return sandboxes_path(self.namespace, self.name)

    async def refresh(self) -> Sandbox:
        """Reads the Sandbox again."""
        kube = await self._kube()
        obj = await kube.get_opt(self._path())
        if obj is None:
            raise NotFoundError(f"sandbox {self.namespace}/{self.name} not found")
        self.obj = obj
        return self

    async def wait_ready(self, timeout: float = 120.0, *, resume: bool = False) -> Sandbox:
        """Waits (with a watch) until the Sandbox is Ready. Raises at once
        :class:`~agentbox.errors.SandboxFailedError` (with the failing condition's reason) when
        it fails or its start is ``Stalled`` (see :func:`stalled`),
        :class:`~agentbox.errors.SandboxSuspendedError` when its spec suspends it (with
        ``resume=True`` it is resumed and waited for instead), and
        :class:`~agentbox.errors.SandboxNotReadyError` at the timeout.
        """
        kube = await self._kube()

        def decide(obj: Mapping[str, Any] | None) -> bool:
            if obj is None:
                raise NotFoundError(f"sandbox {self.namespace}/{self.name} was deleted")
            state = readiness(obj)
            if state == "ready":
                return True
            reason, message = failing_condition(obj)
            phase = str((obj.get("status") or {}).get("phase") or "")
            if state == "failed":
                raise SandboxFailedError(self.name, phase, reason or "Failed", message)
            if state == "suspended" and not resume:
                raise SandboxSuspendedError(
                    self.name, phase, "Suspended", "spec.lifecycle.mode is Suspended; resume it"
                )
            return False

        if resume:
            await self.refresh()
            if ((self.obj.get("spec") or {}).get("lifecycle") or {}).get("mode") == "Suspended":
                await self.resume()
        obj = await watch_until(kube, sandboxes_path(self.namespace), self.name, decide, timeout)
        if obj is None:
            await self.refresh()
            reason, message = failing_condition(self.obj)
            raise SandboxNotReadyError(
                self.name, self.phase or "", reason, message or f"not Ready after {timeout}s"
            )
        self.obj = obj
        return self

    async def recover(self, timeout: float = 120.0) -> Sandbox:
        """Waits until the sandbox serves commands in a live pod again — after its pod was
        deleted or evicted, its node lost, or the sandbox suspended (it is resumed): the
        operator starts a new pod on the workspace (or restores the workspace from a snapshot)
        and this returns once that pod is the one the workspace was initialised in. Raises
        like :meth:`wait_ready`; a sandbox already serving returns at once.
        """
        kube = await self._kube()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            await self.refresh()
            if readiness(self.obj) == "suspended":
                await self.resume()
            pod = await kube.get_opt(pod_path(self.namespace, self.pod_name))
            if serving(self.obj, pod):
                return self
            remaining = deadline - loop.time()
            if remaining <= 0:
                reason, message = failing_condition(self.obj)
                raise SandboxNotReadyError(
                    self.name, self.phase or "", reason, message or f"not serving after {timeout}s"
                )
            if readiness(self.obj) == "ready":
                # Ready, but from a pod that is gone or going: the new one follows shortly.
                await asyncio.sleep(min(0.2, remaining))
            else:
                await self.wait_ready(remaining)

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        stdin: StdinSource | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_output: int = _wire.DEFAULT_MAX_OUTPUT,
        check: bool = False,
    ) -> ExecResult:
        """Runs a command (a shell string for ``sh -c``, or an argv) to completion: its real
        exit code, stdout and stderr (each capped at ``max_output``, with truncation flags).
        ``timeout`` kills its whole process group in the pod and raises
        :class:`~agentbox.exec.ExecTimeoutError`; ``check`` raises
        :class:`~agentbox.exec.CommandError` on a non-zero exit.
        """
        return await _exec.run(
            await self._kube(),
            self.namespace,
            self.pod_name,
            command,
            stdin=stdin,
            timeout=timeout,
            cwd=cwd or self.workspace_root,
            env=env,
            max_output=max_output,
            check=check,
        )

    async def exec_stream(
        self,
        command: str | Sequence[str],
        *,
        stdin: StdinSource | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecStream:
        """Starts a command and streams its output (:class:`~agentbox.ExecStream`)."""
        return await _exec.stream(
            await self._kube(),
            self.namespace,
            self.pod_name,
            command,
            stdin=stdin,
            timeout=timeout,
            cwd=cwd or self.workspace_root,
            env=env,
        )

    def session(self, *, cwd: str | None = None) -> Session:
        """A persistent shell (commands run in ``cwd``, default the workspace root); it starts
        with its first command. Close it with ``async with`` or :meth:`Session.close`.
        """
        return Session(
            self._sandboxes.kube, self.namespace, self.pod_name, cwd=cwd or self.workspace_root
        )

    async def _files(self) -> Workspace:
        return Workspace(await self._kube(), self.namespace, self.pod_name, self.workspace_root)

    async def read(self, path: str, *, max_bytes: int = READ_CAP) -> bytes:
        """A workspace file's content (:class:`~agentbox.errors.FileTooLargeError` past
        ``max_bytes``, :class:`~agentbox.errors.RemoteFileNotFoundError` if missing).
        """
        return await (await self._files()).read(path, max_bytes)

    async def write(self, path: str, data: StdinSource, *, mode: int | None = None) -> None:
        """Writes a workspace file atomically, creating parent directories; ``data`` is bytes,
        text, a binary file or an (async) iterable of chunks, streamed; ``mode`` like
        ``0o755``.
        """
        await (await self._files()).write(path, data, mode)

    async def ls(self, path: str = "") -> builtins.list[DirEntry]:
        """A workspace directory's entries, sorted by name."""
        return await (await self._files()).ls(path)

    async def stat(self, path: str) -> DirEntry:
        """One workspace entry (symlinks not followed)."""
        return await (await self._files()).stat(path)

    async def exists(self, path: str) -> bool:
        """Whether a workspace path exists."""
        return await (await self._files()).exists(path)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, symlink or empty directory (a tree with ``recursive``)."""
        await (await self._files()).rm(path, recursive)

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Creates a workspace directory."""
        await (await self._files()).mkdir(path, parents)

    async def upload_dir(self, local: str | os.PathLike[str], remote: str = "") -> None:
        """Copies a local directory into a workspace directory (tar, streamed)."""
        await (await self._files()).upload_dir(local, remote)

    async def download_dir(self, remote: str, local: str | os.PathLike[str]) -> None:
        """Copies a workspace directory into a local directory (tar, streamed, members that
        would leave ``local`` refused).
        """
        await (await self._files()).download_dir(remote, local)

    def _hold(self, guard: Guard) -> dict[str, Any]:
        """The hand-off fields (``GuardHold``) of ``guard``: raises before any request when it
        is not held or is another scope's.
        """
        want = _labels.lease_name(_labels.scope_key(self.scope))
        if guard.lease_name != want:
            raise ScopeMismatchError(
                f"guard {guard.lease_name} is not the guard of sandbox {self.name}'s scope ({want})"
            )
        if not guard.held:
            raise GuardError(
                f"guard {guard.lease_name} is not held: only a held guard is handed over"
            )
        return {"holder": guard.holder, "token": guard.fencing_token}

    async def _set_mode(self, mode: str, guard: Guard | None = None) -> None:
        hold = self._hold(guard) if guard is not None else None
        kube = await self._kube()
        self.obj = await kube.call(
            "PATCH",
            self._path(),
            # A hold from an earlier call is cleared (null removes it).
            body={"spec": {"lifecycle": {"mode": mode, "guard": hold}}},
            content_type="application/merge-patch+json",
        )

    async def suspend(
        self, *, guard: Guard | None = None, wait: bool = False, timeout: float = 120.0
    ) -> None:
        """Suspends the sandbox: its pod is deleted, its workspace kept on the node.

        The operator stops the pod only under the scope's guard, never under a harness at work:
        with ``guard`` (held by the caller, who keeps it until this returns; implies ``wait``)
        under that hold, so nobody can start work between the caller's last command and the
        suspension; without, under its own guard once nobody holds it. With ``wait``, returns
        once the Sandbox is Suspended, or raises :class:`~agentbox.errors.SandboxNotReadyError`
        after ``timeout`` seconds.
        """
        await self._set_mode("Suspended", guard)
        if wait or guard is not None:
            await self._wait_phase("Suspended", timeout)

    async def _wait_phase(self, phase: str, timeout: float) -> None:
        kube = await self._kube()

        def decide(obj: Mapping[str, Any] | None) -> bool:
            if obj is None:
                raise NotFoundError(f"sandbox {self.namespace}/{self.name} was deleted")
            return (obj.get("status") or {}).get("phase") == phase

        obj = await watch_until(kube, sandboxes_path(self.namespace), self.name, decide, timeout)
        if obj is None:
            await self.refresh()
            reason, _ = failing_condition(self.obj)
            raise SandboxNotReadyError(
                self.name, self.phase or "", reason or "Timeout", f"not {phase} after {timeout}s"
            )
        self.obj = obj

    async def resume(self) -> None:
        """Resumes a suspended sandbox (a new pod reuses the workspace); see
        :meth:`wait_ready`.
        """
        await self._set_mode("Running")

    async def delete(self, *, wait: bool = False, timeout: float = 120.0) -> None:
        """Deletes the Sandbox (its pod and workspace go too; snapshots stay). With ``wait``,
        returns once it is gone, or raises :class:`~agentbox.errors.SandboxNotDeletedError`
        when it still exists after ``timeout`` seconds.
        """
        kube = await self._kube()
        try:
            await kube.call("DELETE", self._path())
        except NotFoundError:
            return
        if wait and not await wait_gone(kube, self._path(), timeout):
            raise SandboxNotDeletedError(
                self.name, "Terminating", "Timeout", f"still exists after {timeout}s"
            )

    async def snapshot(
        self,
        name: str | None = None,
        *,
        wait: bool = True,
        timeout: float = 600.0,
        deletion_policy: Literal["Delete", "Retain"] = "Delete",
        guard: Guard | None = None,
    ) -> Snapshot:
        """Asks the operator for a snapshot of the workspace (a new SandboxSnapshot, taken under
        the scope's guard) and, with ``wait``, waits until it is Ready.

        Without ``guard`` the operator takes the scope's guard itself, once nobody holds it.
        With ``guard`` (held by the caller, who keeps it until the snapshot is Ready or Failed)
        the snapshot is taken under that hold: nothing can work in the scope between the
        caller's last command and the snapshot. It fails with the reason ``GuardNotHeld`` when
        the hold is gone before the snapshot starts.
        """
        hold = self._hold(guard) if guard is not None else None
        kube = await self._kube()
        snap = await _snapshots.create(
            kube, self.namespace, self.name, self.scope, name, deletion_policy, guard=hold
        )
        if not wait:
            return snap
        return await _snapshots.wait(kube, self.namespace, snap.name, timeout)

    async def snapshots(self) -> builtins.list[Snapshot]:
        """The scope's lineage (snapshots of every sandbox of this scope), oldest first."""
        return await self._sandboxes.snapshots(self.scope)

    async def restore(self, snapshot: str, *, timeout: float = 120.0) -> Sandbox:
        """Replaces the workspace with a Ready snapshot's, the way the CRD restores (only a
        fresh workspace is restored): the Sandbox is deleted (its pod and workspace go) and
        created again under the same name, labels and spec with ``snapshot.restore: Named``.
        Returns once it is created; then :meth:`wait_ready`.
        """
        snap = await self._sandboxes.get_snapshot(snapshot)
        if snap.phase != "Ready":
            raise SnapshotFailedError(
                snapshot, snap.phase, "NotReady", "only a Ready snapshot can be restored"
            )
        await self.refresh()
        meta = self.obj.get("metadata") or {}
        spec = dict(self.obj.get("spec") or {})
        spec["snapshot"] = {**(spec.get("snapshot") or {}), "restore": "Named", "name": snapshot}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {k: v for k, v in meta.items() if k in ("name", "labels", "annotations")},
            "spec": spec,
        }
        await self.delete(wait=True, timeout=timeout)
        kube = await self._kube()
        self.obj = await kube.call("POST", sandboxes_path(self.namespace), body=body)
        return self

    def guard(self, *, wait: float | None = None, config: GuardConfig | None = None) -> Guard:
        """The scope's execution guard: ``async with sbx.guard(wait=60) as g:`` acquires it
        (waiting up to ``wait`` seconds; ``None``: indefinitely) and releases it at the end;
        losing it cancels the block. See :class:`~agentbox.Guard`.
        """
        return self._sandboxes.guard(self.scope, wait=wait, config=config)
