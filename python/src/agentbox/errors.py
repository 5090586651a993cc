"""The exceptions of the SDK: one hierarchy under :class:`AgentboxError`.

Catch :class:`AgentboxError` for everything the SDK raises on purpose. Bad input is refused
before any request (:class:`InvalidRequestError`, a :class:`ValueError` too); what the API
server refuses comes back as :class:`ApiError` with the server's own message; timeouts are
also :class:`TimeoutError`, and a missing workspace file also :class:`FileNotFoundError`, so
code written against the standard exceptions keeps working.

The two exec errors that carry an :class:`~agentbox.exec.ExecResult`,
:class:`~agentbox.exec.CommandError` and :class:`~agentbox.exec.ExecTimeoutError`, live beside
it in :mod:`agentbox.exec` (as ``subprocess`` keeps ``CalledProcessError`` beside
``CompletedProcess``), so this module imports nothing of the SDK's.
"""

from __future__ import annotations

__all__ = [
    "AgentboxError",
    "ApiError",
    "CommandNotStartedError",
    "ConflictError",
    "ExecError",
    "FileTooLargeError",
    "GuardError",
    "GuardLostError",
    "GuardTimeoutError",
    "InvalidRequestError",
    "InvalidSpecError",
    "NotFoundError",
    "OutOfMemoryError",
    "OutputCutError",
    "PathError",
    "ProtocolError",
    "RemoteError",
    "RemoteFileNotFoundError",
    "SandboxFailedError",
    "SandboxNotDeletedError",
    "SandboxNotReadyError",
    "SandboxSuspendedError",
    "ScopeMismatchError",
    "SessionError",
    "SnapshotFailedError",
    "TransportError",
    "UploadSpoolError",
    "UploadTooLargeError",
]


class AgentboxError(Exception):
    """Base class of every error the SDK raises."""


class InvalidRequestError(AgentboxError, ValueError):
    """Bad input, refused before any request is sent (an empty command, a bad scope...)."""


class PathError(InvalidRequestError):
    """A workspace path that may not be used.

    ``reason`` is ``"DotDot"`` (a ``..`` component), ``"OutsideRoot"`` (an absolute path
    outside the workspace root), ``"Invalid"`` (NUL, or a relative root) — all refused before
    any request — or ``"Escapes"`` (it resolves through a symlink outside the workspace, found
    in the pod).
    """

    def __init__(self, path: str, reason: str, message: str) -> None:
        super().__init__(message)
        #: The path as given.
        self.path = path
        #: ``DotDot``, ``OutsideRoot``, ``Invalid`` or ``Escapes``.
        self.reason = reason


class ApiError(AgentboxError):
    """The Kubernetes API server refused a request; ``message`` is its own explanation."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        #: HTTP status code.
        self.status = status
        #: The Status object's ``reason`` (``Invalid``, ``Forbidden``, ...).
        self.reason = reason
        #: The Status object's ``message``.
        self.message = message


class InvalidSpecError(ApiError):
    """The API server refused an object as invalid (HTTP 422): schema or CEL rules."""


class ConflictError(ApiError):
    """The object exists already, or changed since it was read (HTTP 409)."""


class NotFoundError(AgentboxError, LookupError):
    """A Sandbox, snapshot or workspace file does not exist."""


class RemoteFileNotFoundError(NotFoundError, FileNotFoundError):
    """A workspace path is missing or of the wrong type (not a file, not a directory)."""


class TransportError(AgentboxError):
    """The API server or the exec connection could not be reached, or broke mid-way.

    A command whose connection broke may or may not have run (in part).
    """


class ProtocolError(AgentboxError):
    """Unexpected data from the API server or the pod."""


class _StateError(AgentboxError):
    """An object that did not reach the state asked for: its name, the phase last seen and
    the reason and message of the condition that explains it.
    """

    _what = "object"

    def __init__(self, name: str, phase: str, reason: str = "", message: str = "") -> None:
        text = f"{self._what} {name}: phase {phase or 'unknown'}"
        if reason:
            text += f": {reason}"
        if message:
            text += f": {message}"
        super().__init__(text)
        #: Object name.
        self.name = name
        #: Phase last seen.
        self.phase = phase
        #: Reason of the failing (or pending) condition.
        self.reason = reason
        #: Its message.
        self.message = message


class SandboxNotReadyError(_StateError):
    """A Sandbox did not become Ready in time (or cannot: see the subclasses)."""

    _what = "sandbox"


class SandboxFailedError(SandboxNotReadyError):
    """The Sandbox is in phase Failed (it will not become Ready until its spec changes), or its
    start is ``Stalled``: refused for a reason waiting will not fix, such as another scope's
    snapshot, until the spec, the snapshot or the namespace changes.
    """


class SandboxSuspendedError(SandboxNotReadyError):
    """The Sandbox is suspended by its spec; resume it (``resume()``) to use it."""


class SandboxNotDeletedError(_StateError, TimeoutError):
    """A deleted Sandbox still existed when ``delete(wait=True)`` stopped waiting (its
    finalizer's cleanup — the on-stop snapshot, the pod, the workspace — was not done).
    """

    _what = "sandbox"


class SnapshotFailedError(_StateError):
    """A SandboxSnapshot failed, or did not become Ready in time."""

    _what = "snapshot"


class ScopeMismatchError(AgentboxError):
    """A Sandbox has the name of a scope but another scope (it was made by hand)."""


class ExecError(AgentboxError):
    """Base class of command execution failures."""


class CommandNotStartedError(ExecError):
    """The runtime refused to start the command (container not running; a program that does
    not exist is exit code 127 from the exec wrapper's shell).
    """


class OutputCutError(ExecError):
    """A stream of a command's output did not end with the exec wrapper's trailer: bytes were
    lost on the way (kubernetes/kubernetes#124571) or the wrapper was killed. The command ran,
    in part or whole; what it printed is not returned, since it is not all there. Raised by
    one-shot exec, streamed exec (after the chunks that did arrive), file reads and downloads.
    """

    def __init__(self, stream: str, received: int) -> None:
        super().__init__(
            f"the command's {stream} was cut: {received} bytes arrived"
            " without the end of the stream"
        )
        #: ``"stdout"`` or ``"stderr"``.
        self.stream = stream
        #: Bytes of that stream that arrived.
        self.received = received


class OutOfMemoryError(ExecError):
    """The command was killed for memory: the kernel's OOM killer ended it when its container
    reached its memory limit (exit code 137, and the container's OOM kill counter rose while it
    ran), or, with ``container`` true, the whole sandbox container was killed for memory (the
    kubelet's ``OOMKilled``) while it ran, every process in it with it. Raise the sandbox's
    ``resources.limits.memory`` or make the command use less; running it again as it is will
    most likely end the same way.
    """

    def __init__(self, container: bool) -> None:
        super().__init__(
            "out of memory: the sandbox's container was killed for memory (OOMKilled) while"
            " the command ran, and every process in it with it; raise the sandbox's"
            " resources.limits.memory"
            if container
            else "out of memory: the command was killed for memory (the kernel's OOM killer,"
            " exit code 137) when its container reached its memory limit; raise the"
            " sandbox's resources.limits.memory"
        )
        #: The whole container was killed (sessions and every process in it), not only the
        #: command.
        self.container = container


class SessionError(ExecError):
    """A persistent session's shell died while a command ran (the command may have run)."""


class RemoteError(AgentboxError):
    """A file operation failed in the pod; ``stderr`` says why."""

    def __init__(self, exit_code: int | None, stderr: str) -> None:
        super().__init__(f"remote command failed (exit code {exit_code}): {stderr}")
        #: Exit code of the in-pod script.
        self.exit_code = exit_code
        #: What it printed on stderr.
        self.stderr = stderr


class UploadSpoolError(RemoteError):
    """A directory upload's archive could not be written to its spool in the pod, most often
    because the workspace's disk is full (``stderr`` has the pod's own words): nothing was
    extracted and no spool is left.
    """

    def __init__(self, exit_code: int | None, stderr: str) -> None:
        super().__init__(exit_code, stderr)
        self.args = (
            "the upload could not be spooled in the pod (is the workspace's disk full?): " + stderr,
        )


class UploadTooLargeError(RemoteError):
    """A directory upload would pass the workspace's size limit (``workspace.sizeLimit``):
    ``stderr`` has the pod's own words, with the sizes and the limit. Refused before anything
    was extracted, and no spool is left.
    """

    def __init__(self, exit_code: int | None, stderr: str) -> None:
        super().__init__(exit_code, stderr)
        self.args = ("the upload would pass the workspace's size limit: " + stderr,)


class FileTooLargeError(AgentboxError):
    """A workspace file is larger than the read cap."""


class GuardError(AgentboxError):
    """Base class of execution-guard failures."""


class GuardTimeoutError(GuardError, TimeoutError):
    """Waited for the scope's guard until the deadline; ``holder`` held it last."""

    def __init__(self, lease: str, holder: str) -> None:
        super().__init__(f"timed out waiting for lease {lease} (held by {holder or 'nobody'})")
        #: Lease name.
        self.lease = lease
        #: Holder seen last.
        self.holder = holder


class GuardLostError(GuardError):
    """The guard was lost (taken over, deleted, or not renewed in time); the work must stop."""

    def __init__(self, lease: str) -> None:
        super().__init__(f"lost lease {lease}")
        #: Lease name.
        self.lease = lease
