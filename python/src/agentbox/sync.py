"""The synchronous API: the same classes and methods as :mod:`agentbox`, each call running
the async core on a private event-loop thread (see :mod:`agentbox._portal`).

::

    from agentbox import Scope, SandboxSpec
    from agentbox.sync import Sandboxes

    with Sandboxes("agents") as sandboxes:
        scope = Scope.for_user("coder", "alice")
        sbx = sandboxes.get_or_create(scope, SandboxSpec(image="docker.io/library/busybox:1.37"))
        sbx.wait_ready()
        with sbx.guard(wait=60) as g:
            print(sbx.exec(["echo", str(g.fencing_token)]).stdout_text())

A sync guard cannot interrupt plain Python code; instead every agentbox call made on that
thread inside its ``with`` block is cancelled and raises
:class:`~agentbox.errors.GuardLostError` once the guard is lost, and so does leaving the block.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

from . import _portal, _wire
from . import client as _client
from . import exec as _exec
from . import guard as _guard
from . import ports as _ports
from . import session as _session
from .client import EndedScope
from .errors import GuardLostError
from .exec import ExecEvent, ExecResult, StdinSource
from .files import READ_CAP, DirEntry
from .guard import GuardConfig
from .ports import Endpoint
from .scope import Scope
from .snapshots import Snapshot
from .spec import SandboxSpec

__all__ = ["ExecStream", "Guard", "PortForward", "Sandbox", "Sandboxes", "Session"]


class Sandboxes:
    """The Sandboxes of one namespace (sync); see :class:`agentbox.Sandboxes`. Its API client
    is made from the in-cluster service account or the kubeconfig on first use.
    """

    def __init__(self, namespace: str | None = None) -> None:
        self._async = _client.Sandboxes(namespace)

    @property
    def namespace(self) -> str:
        """The namespace."""
        return self._async.namespace

    def __enter__(self) -> Sandboxes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the API client."""
        _portal.call(self._async.close(), guarded=False)

    def get_or_create(self, scope: Scope, spec: SandboxSpec | Mapping[str, Any]) -> Sandbox:
        """See :meth:`agentbox.Sandboxes.get_or_create`."""
        return Sandbox(_portal.call(self._async.get_or_create(scope, spec)))

    def templates(self) -> builtins.list[dict[str, Any]]:
        """See :meth:`agentbox.Sandboxes.templates`."""
        return _portal.call(self._async.templates())

    def pools(self) -> builtins.list[dict[str, Any]]:
        """See :meth:`agentbox.Sandboxes.pools`."""
        return _portal.call(self._async.pools())

    def open(self, name: str) -> Sandbox:
        """See :meth:`agentbox.Sandboxes.open`."""
        return Sandbox(_portal.call(self._async.open(name)))

    def open_scope(self, scope: Scope) -> Sandbox:
        """See :meth:`agentbox.Sandboxes.open_scope`."""
        return Sandbox(_portal.call(self._async.open_scope(scope)))

    def list(
        self, selector: str | None = None, *, scope: Scope | None = None
    ) -> builtins.list[Sandbox]:
        """See :meth:`agentbox.Sandboxes.list`."""
        return [Sandbox(s) for s in _portal.call(self._async.list(selector, scope=scope))]

    def create_restored(
        self,
        scope: Scope,
        spec: SandboxSpec | Mapping[str, Any],
        snapshot: str,
        *,
        name: str | None = None,
    ) -> Sandbox:
        """See :meth:`agentbox.Sandboxes.create_restored`."""
        return Sandbox(_portal.call(self._async.create_restored(scope, spec, snapshot, name=name)))

    def get_snapshot(self, name: str) -> Snapshot:
        """See :meth:`agentbox.Sandboxes.get_snapshot`."""
        return _portal.call(self._async.get_snapshot(name))

    def wait_snapshot(self, name: str, timeout: float = 600.0) -> Snapshot:
        """See :meth:`agentbox.Sandboxes.wait_snapshot`."""
        return _portal.call(self._async.wait_snapshot(name, timeout))

    def snapshots(self, scope: Scope) -> builtins.list[Snapshot]:
        """See :meth:`agentbox.Sandboxes.snapshots`."""
        return _portal.call(self._async.snapshots(scope))

    def end_scope(self, scope: Scope, *, keep: int = 0, timeout: float = 300.0) -> EndedScope:
        """See :meth:`agentbox.Sandboxes.end_scope`."""
        return _portal.call(self._async.end_scope(scope, keep=keep, timeout=timeout))

    def guard(
        self, scope: Scope, *, wait: float | None = None, config: GuardConfig | None = None
    ) -> Guard:
        """See :meth:`agentbox.Sandboxes.guard`."""
        return Guard(self._async.guard(scope, wait=wait, config=config))


class Sandbox:
    """One Sandbox (sync); see :class:`agentbox.Sandbox`."""

    def __init__(self, sandbox: _client.Sandbox) -> None:
        #: The async handle this one drives.
        self.aio = sandbox

    @property
    def name(self) -> str:
        """The Sandbox's name."""
        return self.aio.name

    @property
    def namespace(self) -> str:
        """Its namespace."""
        return self.aio.namespace

    @property
    def obj(self) -> dict[str, Any]:
        """The Sandbox object as last read."""
        return self.aio.obj

    @property
    def spec(self) -> SandboxSpec:
        """The spec as last read."""
        return self.aio.spec

    @property
    def scope(self) -> Scope:
        """The isolation scope."""
        return self.aio.scope

    @property
    def status(self) -> Mapping[str, Any]:
        """The status as last read."""
        return self.aio.status

    @property
    def phase(self) -> str | None:
        """The phase as last read."""
        return self.aio.phase

    @property
    def pod_name(self) -> str:
        """The sandbox's pod."""
        return self.aio.pod_name

    @property
    def workspace_root(self) -> str:
        """The workspace root in the container."""
        return self.aio.workspace_root

    @property
    def endpoints(self) -> builtins.list[Endpoint]:
        """Where the ports of ``spec.ports`` are reached, as last read."""
        return self.aio.endpoints

    def port_forward(self, port: int, *, local_port: int = 0) -> PortForward:
        """A listener on ``127.0.0.1`` whose connections reach ``port`` of the sandbox's pod:
        ``with sbx.port_forward(8080) as pf:``; see :meth:`agentbox.Sandbox.port_forward`.
        """
        return PortForward(self.aio.port_forward(port, local_port=local_port))

    def refresh(self) -> Sandbox:
        """See :meth:`agentbox.Sandbox.refresh`."""
        _portal.call(self.aio.refresh())
        return self

    def wait_ready(self, timeout: float = 120.0, *, resume: bool = False) -> Sandbox:
        """See :meth:`agentbox.Sandbox.wait_ready`."""
        _portal.call(self.aio.wait_ready(timeout, resume=resume))
        return self

    def recover(self, timeout: float = 120.0) -> Sandbox:
        """Waits until the sandbox serves commands in a live pod again; see
        :meth:`agentbox.Sandbox.recover`.
        """
        _portal.call(self.aio.recover(timeout))
        return self

    def exec(
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
        """See :meth:`agentbox.Sandbox.exec`."""
        return _portal.call(
            self.aio.exec(
                command,
                stdin=stdin,
                timeout=timeout,
                env=env,
                cwd=cwd,
                max_output=max_output,
                check=check,
            )
        )

    def exec_stream(
        self,
        command: str | Sequence[str],
        *,
        stdin: StdinSource | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecStream:
        """See :meth:`agentbox.Sandbox.exec_stream`."""
        return ExecStream(
            _portal.call(
                self.aio.exec_stream(command, stdin=stdin, timeout=timeout, env=env, cwd=cwd)
            )
        )

    def session(self, *, cwd: str | None = None) -> Session:
        """See :meth:`agentbox.Sandbox.session`."""
        return Session(self.aio.session(cwd=cwd))

    def read(self, path: str, *, max_bytes: int = READ_CAP) -> bytes:
        """See :meth:`agentbox.Sandbox.read`."""
        return _portal.call(self.aio.read(path, max_bytes=max_bytes))

    def write(self, path: str, data: StdinSource, *, mode: int | None = None) -> None:
        """See :meth:`agentbox.Sandbox.write`."""
        _portal.call(self.aio.write(path, data, mode=mode))

    def ls(self, path: str = "") -> builtins.list[DirEntry]:
        """See :meth:`agentbox.Sandbox.ls`."""
        return _portal.call(self.aio.ls(path))

    def stat(self, path: str) -> DirEntry:
        """See :meth:`agentbox.Sandbox.stat`."""
        return _portal.call(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        """See :meth:`agentbox.Sandbox.exists`."""
        return _portal.call(self.aio.exists(path))

    def rm(self, path: str, *, recursive: bool = False) -> None:
        """See :meth:`agentbox.Sandbox.rm`."""
        _portal.call(self.aio.rm(path, recursive=recursive))

    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """See :meth:`agentbox.Sandbox.mkdir`."""
        _portal.call(self.aio.mkdir(path, parents=parents))

    def upload_dir(self, local: str | os.PathLike[str], remote: str = "") -> None:
        """See :meth:`agentbox.Sandbox.upload_dir`."""
        _portal.call(self.aio.upload_dir(local, remote))

    def download_dir(self, remote: str, local: str | os.PathLike[str]) -> None:
        """See :meth:`agentbox.Sandbox.download_dir`."""
        _portal.call(self.aio.download_dir(remote, local))

    def suspend(
        self, *, guard: Guard | None = None, wait: bool = False, timeout: float = 120.0
    ) -> None:
        """See :meth:`agentbox.Sandbox.suspend`."""
        g = guard._async if guard is not None else None
        _portal.call(self.aio.suspend(guard=g, wait=wait, timeout=timeout))

    def resume(self) -> None:
        """See :meth:`agentbox.Sandbox.resume`."""
        _portal.call(self.aio.resume())

    def delete(self, *, wait: bool = False, timeout: float = 120.0) -> None:
        """See :meth:`agentbox.Sandbox.delete`."""
        _portal.call(self.aio.delete(wait=wait, timeout=timeout))

    def snapshot(
        self,
        name: str | None = None,
        *,
        wait: bool = True,
        timeout: float = 600.0,
        deletion_policy: Literal["Delete", "Retain"] = "Delete",
        guard: Guard | None = None,
    ) -> Snapshot:
        """See :meth:`agentbox.Sandbox.snapshot`."""
        g = guard._async if guard is not None else None
        return _portal.call(
            self.aio.snapshot(
                name, wait=wait, timeout=timeout, deletion_policy=deletion_policy, guard=g
            )
        )

    def snapshots(self) -> builtins.list[Snapshot]:
        """See :meth:`agentbox.Sandbox.snapshots`."""
        return _portal.call(self.aio.snapshots())

    def restore(self, snapshot: str, *, timeout: float = 120.0) -> Sandbox:
        """See :meth:`agentbox.Sandbox.restore`."""
        _portal.call(self.aio.restore(snapshot, timeout=timeout))
        return self

    def guard(self, *, wait: float | None = None, config: GuardConfig | None = None) -> Guard:
        """The scope's execution guard: ``with sbx.guard(wait=60) as g:``; see the module
        docstring for what losing it does in sync code.
        """
        return Guard(self.aio.guard(wait=wait, config=config))


class PortForward:
    """A listener on ``127.0.0.1`` forwarding each connection to a port of a sandbox's pod
    (sync); see :class:`agentbox.PortForward`. Its connections are served on the facade's
    event-loop thread, so they flow while this thread runs other code.
    """

    def __init__(self, forward: _ports.PortForward) -> None:
        self._async = forward

    @property
    def namespace(self) -> str:
        """The pod's namespace."""
        return self._async.namespace

    @property
    def pod(self) -> str:
        """The pod."""
        return self._async.pod

    @property
    def port(self) -> int:
        """The pod's port."""
        return self._async.port

    @property
    def host(self) -> str:
        """Where the listener is (loopback only)."""
        return self._async.host

    @property
    def local_port(self) -> int:
        """The local port (chosen by the system when 0 was asked for), once started."""
        return self._async.local_port

    @property
    def last_error(self) -> str:
        """The last error a forwarded connection met, for diagnostics."""
        return self._async.last_error

    def start(self) -> PortForward:
        """Starts listening."""
        _portal.call(self._async.start())
        return self

    def close(self) -> None:
        """Stops listening and ends the connections it forwards."""
        _portal.call(self._async.close(), guarded=False)

    def __enter__(self) -> PortForward:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExecStream:
    """A running command's events (sync); see :class:`agentbox.ExecStream`."""

    def __init__(self, stream: _exec.ExecStream) -> None:
        self._async = stream
        self._it = stream.__aiter__()

    def __iter__(self) -> Iterator[ExecEvent]:
        return self

    def __next__(self) -> ExecEvent:
        try:
            return _portal.call(self._it.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection (the command keeps running unless killed)."""
        _portal.call(self._async.aclose(), guarded=False)

    def kill(self) -> None:
        """See :meth:`agentbox.ExecStream.kill`."""
        _portal.call(self._async.kill())

    @property
    def process_id(self) -> str | None:
        """See :attr:`agentbox.ExecStream.process_id`."""
        return self._async.process_id

    def collect(self, max_output: int = _wire.DEFAULT_MAX_OUTPUT) -> ExecResult:
        """Reads the stream to its end."""
        return _portal.call(self._async.collect(max_output))


class Session:
    """A persistent shell (sync); see :class:`agentbox.Session`."""

    def __init__(self, session: _session.Session) -> None:
        self._async = session

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Starts the shell now."""
        _portal.call(self._async.start())

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        max_output: int = _wire.DEFAULT_MAX_OUTPUT,
        check: bool = False,
    ) -> ExecResult:
        """See :meth:`agentbox.Session.run`."""
        return _portal.call(
            self._async.run(
                command, timeout=timeout, cwd=cwd, env=env, max_output=max_output, check=check
            )
        )

    def close(self) -> None:
        """Ends the shell."""
        _portal.call(self._async.close(), guarded=False)


class Guard:
    """A scope's execution guard (sync); see :class:`agentbox.Guard`."""

    def __init__(self, guard: _guard.Guard) -> None:
        self._async = guard

    @property
    def fencing_token(self) -> int:
        """The fencing token (``leaseTransitions`` of this acquisition)."""
        return self._async.fencing_token

    @property
    def lease_name(self) -> str:
        """Name of the Lease."""
        return self._async.lease_name

    @property
    def holder(self) -> str:
        """The identity this holder writes to the Lease."""
        return self._async.holder

    @property
    def is_lost(self) -> bool:
        """Whether the guard has been lost."""
        return self._async.is_lost

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called (the guard is no longer in use)."""
        return self._async.released

    @property
    def held(self) -> bool:
        """Acquired, not released and not lost."""
        return self._async.held

    @property
    def acquired_at(self) -> datetime | None:
        """When the lease was acquired (its ``acquireTime``)."""
        return self._async.acquired_at

    def check(self) -> None:
        """Raises :class:`~agentbox.errors.GuardLostError` if the guard was lost."""
        self._async.check()

    def acquire(self) -> Guard:
        """Takes the lease (waiting up to ``wait``)."""
        _portal.call(self._async.acquire())
        return self

    def release(self) -> None:
        """Releases the lease (:class:`~agentbox.errors.GuardLostError` if it was lost)."""
        _portal.call(self._async.release(), guarded=False)

    def __enter__(self) -> Guard:
        self.acquire()
        _portal.active_guards().append(self._async)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        guards = _portal.active_guards()
        if self._async in guards:
            guards.remove(self._async)
        try:
            self.release()
        except GuardLostError as lost:
            raise lost from exc
