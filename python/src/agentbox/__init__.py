"""agentbox for Python: isolated, recoverable sandboxes for agent harnesses on Kubernetes.

The async API is the core::

    import agentbox

    async with agentbox.Sandboxes("agents") as sandboxes:
        scope = agentbox.Scope.for_user("coder", "alice@example.com")
        spec = agentbox.SandboxSpec(image="docker.io/library/busybox:1.37")
        sbx = await sandboxes.get_or_create(scope, spec)
        await sbx.wait_ready()
        result = await sbx.exec("ls; exit 3", timeout=30)
        assert result.exit_code == 3

:mod:`agentbox.sync` has the same API for synchronous code.
"""

from . import labels
from ._kinds import ERROR_KINDS, kind_of
from ._version import __version__
from .client import EndedScope, Sandbox, Sandboxes
from .errors import (
    AgentboxError,
    ApiError,
    CommandNotStartedError,
    ConflictError,
    ExecError,
    FileTooLargeError,
    GuardError,
    GuardLostError,
    GuardTimeoutError,
    InvalidRequestError,
    InvalidSpecError,
    NotFoundError,
    OutOfMemoryError,
    OutputCutError,
    PathError,
    ProtocolError,
    RemoteError,
    RemoteFileNotFoundError,
    SandboxFailedError,
    SandboxNotDeletedError,
    SandboxNotReadyError,
    SandboxSuspendedError,
    ScopeMismatchError,
    SessionError,
    SnapshotFailedError,
    TransportError,
    UploadSpoolError,
    UploadTooLargeError,
)
from .exec import (
    CommandError,
    ExecEvent,
    ExecResult,
    ExecStream,
    ExecTimeoutError,
    Exit,
    Output,
)
from .files import DirEntry
from .guard import Guard, GuardConfig
from .ports import Endpoint, PortForward
from .scope import Scope, ScopeKind
from .session import Session
from .snapshots import Snapshot
from .spec import (
    Capabilities,
    EgressAllow,
    EgressCredential,
    EgressPort,
    FileSource,
    HostMount,
    KeyRef,
    Lifecycle,
    Network,
    Port,
    Projection,
    Retention,
    SandboxSecurityContext,
    SandboxSpec,
    SnapshotPolicy,
    TemplateRef,
    WorkspaceFile,
    WorkspaceSpec,
)

__all__ = [
    "ERROR_KINDS",
    "AgentboxError",
    "ApiError",
    "Capabilities",
    "CommandError",
    "CommandNotStartedError",
    "ConflictError",
    "DirEntry",
    "EgressAllow",
    "EgressCredential",
    "EgressPort",
    "EndedScope",
    "Endpoint",
    "ExecError",
    "ExecEvent",
    "ExecResult",
    "ExecStream",
    "ExecTimeoutError",
    "Exit",
    "FileSource",
    "FileTooLargeError",
    "Guard",
    "GuardConfig",
    "GuardError",
    "GuardLostError",
    "GuardTimeoutError",
    "HostMount",
    "InvalidRequestError",
    "InvalidSpecError",
    "KeyRef",
    "Lifecycle",
    "Network",
    "NotFoundError",
    "OutOfMemoryError",
    "Output",
    "OutputCutError",
    "PathError",
    "Port",
    "PortForward",
    "Projection",
    "ProtocolError",
    "RemoteError",
    "RemoteFileNotFoundError",
    "Retention",
    "Sandbox",
    "SandboxFailedError",
    "SandboxNotDeletedError",
    "SandboxNotReadyError",
    "SandboxSecurityContext",
    "SandboxSpec",
    "SandboxSuspendedError",
    "Sandboxes",
    "Scope",
    "ScopeKind",
    "ScopeMismatchError",
    "Session",
    "SessionError",
    "Snapshot",
    "SnapshotFailedError",
    "SnapshotPolicy",
    "TemplateRef",
    "TransportError",
    "UploadSpoolError",
    "UploadTooLargeError",
    "WorkspaceFile",
    "WorkspaceSpec",
    "__version__",
    "kind_of",
    "labels",
]
