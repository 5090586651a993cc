"""The pure parts of exec, mirroring the Rust crate's ``agentbox_api::exec`` byte for byte (and
checked against its vectors): the remote-command channels, the ``sh`` wrapper every command
runs under (a trailer that tells the client it has every byte, a linger until the client has
read it, a workdir, environment and a timeout that really kills), the client's half of the
trailer, and the exit status read from the status channel. docs/protocol.md, "Exec", is the
whole protocol.

Why the wire protocol is spoken here rather than through ``kubernetes_asyncio.stream``: that
client reads the whole output as UTF-8 text, speaks only ``v4.channel.k8s.io`` (no stdin
half-close, so ``tar -x`` and ``cat > file`` cannot see EOF, and the wrapper's linger could not
end) and reduces the status to the first cause's message; the SDK needs bytes, half-close,
caps, the trailer and the real exit code.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ._scripts import PROCESSES as PROCESSES
from ._scripts import SESSION_OOM as SESSION_OOM
from ._scripts import SESSION_SHELL as SESSION_SHELL
from ._scripts import WRAPPER as WRAPPER
from .errors import CommandNotStartedError, InvalidRequestError, OutputCutError, ProtocolError

#: The container of every sandbox pod.
SANDBOX_CONTAINER = "sandbox"
#: Subprotocols offered: v5 only, since only v5 can half-close stdin, which is what ends the
#: wrapper's linger (Kubernetes 1.30 or later).
PROTOCOLS = ("v5.channel.k8s.io",)
STDIN_CHANNEL = 0
STDOUT_CHANNEL = 1
STDERR_CHANNEL = 2
STATUS_CHANNEL = 3
#: v5: ``[CLOSE_CHANNEL, n]`` half-closes channel n.
CLOSE_CHANNEL = 255
#: Largest stdin frame: one WebSocket message per 256 KiB, not per 4 KiB.
STDIN_FRAME = 256 << 10
#: Default cap on each of stdout and stderr.
DEFAULT_MAX_OUTPUT = 8 << 20
#: How long to wait for the exit status after the timeout fired (bounds a wedged connection;
#: the in-pod watchdog normally reports within a round trip).
TIMEOUT_GRACE = 15.0
#: Interval of WebSocket pings on an exec that is silent for long.
PING_EVERY = 60.0


#: The environment entry a streamed exec's command gets (the Rust crate's
#: ``remote::PROCESS_ENV``): ``AGENTBOX_PROCESS=<id>``, a random id of its own, which what it
#: starts inherits; :meth:`agentbox.ExecStream.kill` finds them all by it.
PROCESS_ENV = "AGENTBOX_PROCESS"


def new_mark() -> str:
    """A fresh trailer mark: ``__AGENTBOX_`` + 32 hex digits (16 random bytes) + ``_``."""
    return f"__AGENTBOX_{secrets.token_hex(16)}_"


def is_env_name(name: str) -> bool:
    """Whether ``name`` is a portable environment variable name."""
    if not name or not name.isascii():
        return False
    if not (name[0].isalpha() or name[0] == "_"):
        return False
    return all(c.isalnum() or c == "_" for c in name)


def sleep_arg(seconds: float) -> str:
    """``sleep`` argument for a timeout: seconds with millisecond precision, at least 1 ms."""
    ms = max(int(seconds * 1000 + 1e-6), 1)
    return f"{ms // 1000}.{ms % 1000:03d}"


def command_argv(command: str | Sequence[str]) -> list[str]:
    """A shell string becomes ``sh -c string``; a sequence is the argv itself."""
    if isinstance(command, str):
        return ["sh", "-c", command]
    argv = list(command)
    for a in argv:
        if not isinstance(a, str):
            raise InvalidRequestError(f"command arguments must be strings, not {type(a).__name__}")
    return argv


def validate(
    argv: Sequence[str],
    timeout: float | None,
    env: Mapping[str, str] | None,
    max_output: int,
) -> None:
    """Refuses a bad request before anything is sent."""
    if not argv:
        raise InvalidRequestError("invalid exec request: empty argv")
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0
    ):
        raise InvalidRequestError(
            f"timeout must be a non-negative number of seconds, not {timeout!r}"
        )
    if not isinstance(max_output, int) or max_output < 0:
        raise InvalidRequestError(f"max_output must be a non-negative int, not {max_output!r}")
    for k in env or {}:
        if not is_env_name(k):
            raise InvalidRequestError(
                f"invalid exec request: invalid environment variable name {k!r}"
            )


def stdin_mode(stdin_len: int | None) -> str:
    """The wrapper's ``STDIN`` parameter for stdin of ``stdin_len`` bytes: ``-`` for none (or
    none of zero bytes: the command reads EOF either way), the count, or ``=`` for a stream of
    unknown length (``stdin_len`` ``-1``).
    """
    if stdin_len is None or stdin_len == 0:
        return "-"
    if stdin_len < 0:
        return "="
    return str(stdin_len)


def remote_argv(
    argv: Sequence[str],
    timeout: float | None = None,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    mark: str,
    stdin: str = "-",
) -> list[str]:
    """The argv a one-shot exec sends: always the wrapper, with ``mark`` (:func:`new_mark`) and
    the ``stdin`` mode (:func:`stdin_mode`), then the settings as positional parameters.
    """
    validate(argv, timeout, env, 0)
    env = env or {}
    out = [
        "sh",
        "-c",
        WRAPPER,
        "agentbox-exec",
        mark,
        stdin,
        "" if timeout is None else sleep_arg(timeout),
        workdir or "",
        str(len(env)),
    ]
    out.extend(f"{k}={v}" for k, v in env.items())
    out.extend(argv)
    return out


def session_shell_argv(workdir: str | None) -> list[str]:
    """The argv of a persistent session's shell (pure; vectors: ``session.shell_argv``):
    ``sh``, or :data:`SESSION_SHELL` in ``workdir``.
    """
    if workdir is None:
        return ["sh"]
    return ["sh", "-c", SESSION_SHELL, "sh", workdir]


def session_argv(
    argv: Sequence[str],
    timeout: float | None = None,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The argv of a command in a persistent session, whose shell outlives it (so nothing is
    cut and no trailer is needed): the command itself when it needs no settings, otherwise the
    wrapper with an empty mark.
    """
    validate(argv, timeout, env, 0)
    if timeout is None and workdir is None and not env:
        return list(argv)
    return remote_argv(argv, timeout, workdir, env, mark="", stdin="-")


MEMORY_FLAG = "!"
"""Ends the memory trailer (in place of the mark's last character) and follows the exit code in
a session's end sentinel: the command was killed for memory."""

OOM_KILLED = "OOMKilled"
"""The kubelet's reason for a container the kernel killed for memory."""

OOM_CLOCK_SKEW = 5.0
"""Seconds before an exec's start that a container's ``OOMKilled`` may have finished and still
be taken for the exec's cause (the client's and the node's clocks may differ)."""

OOM_SETTLE = 10.0
"""Seconds a client looks for the kubelet's record after an exec failed."""

OOM_POLL = 0.4
"""Seconds between those looks."""


def memory_trailer(mark: str) -> str:
    """The trailer the wrapper prints instead of ``mark`` when the command was killed for
    memory: ``mark`` with its last character replaced by ``!``.
    """
    return mark[:-1] + MEMORY_FLAG


def parse_session_end(trailer: str) -> tuple[int, bool] | None:
    """A session's end-sentinel trailer: the exit code and whether the command was killed for
    memory (the code followed by ``!``); ``None`` when it is not one.
    """
    t = trailer.strip()
    memory = t.endswith(MEMORY_FLAG)
    if memory:
        t = t[: -len(MEMORY_FLAG)]
    if not t or not (t.isascii() and t.lstrip("-").isdigit()):
        return None
    return int(t), memory


def oom_killed_since(pod: Mapping[str, Any], container: str, since: datetime) -> bool:
    """Whether ``pod``'s status records ``container`` killed for memory (reason ``OOMKilled`` in
    its state or last state) at or after ``since`` less :data:`OOM_CLOCK_SKEW` (a termination
    without ``finishedAt`` counts).
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    after = since - timedelta(seconds=OOM_CLOCK_SKEW)
    for c in statuses:
        if c.get("name") != container:
            continue
        for key in ("state", "lastState"):
            t = (c.get(key) or {}).get("terminated")
            if not t or t.get("reason") != OOM_KILLED:
                continue
            finished = t.get("finishedAt")
            if not finished:
                return True
            at = datetime.fromisoformat(str(finished).replace("Z", "+00:00"))
            if at >= after:
                return True
    return False


class Trailer:
    """The client's half of the trailer: passes a stream's bytes on, holding back the longest
    suffix of what has arrived that is a prefix of the mark or of the memory trailer (at most a
    whole one), so the mark never reaches the caller and ordinary output is held back only while
    it ends like the start of a mark. The stream is whole when what is held back is the whole
    mark or the whole memory trailer (:func:`memory_trailer`: the command was killed for memory).
    """

    __slots__ = ("held", "mark", "memory_mark", "received", "stream")

    def __init__(self, mark: str, stream: str = "stdout") -> None:
        self.mark = mark.encode()
        self.memory_mark = memory_trailer(mark).encode() if mark else b""
        self.held = b""
        self.received = 0
        self.stream = stream

    def push(self, chunk: bytes) -> bytes:
        """Takes the next chunk; returns the bytes to pass on (possibly empty)."""
        self.received += len(chunk)
        # What was held back (at most a mark's length) goes first; usually there is none and
        # the chunk is passed on uncopied.
        data = self.held + chunk if self.held else chunk
        k = (
            max(
                _overlap(data[-len(self.mark) :], self.mark),
                _overlap(data[-len(self.mark) :], self.memory_mark),
            )
            if self.mark
            else 0
        )
        self.held = bytes(data[len(data) - k :])
        return data[: len(data) - k] if k else data

    @property
    def whole(self) -> bool:
        """Whether the stream, as far as it has arrived, ends with the mark or the memory
        trailer.
        """
        return self.held == self.mark or self.memory

    @property
    def memory(self) -> bool:
        """Whether the stream ends with the memory trailer: the command was killed for
        memory.
        """
        return bool(self.mark) and self.held == self.memory_mark

    def check(self) -> None:
        """Raises :class:`OutputCutError` unless the stream is whole."""
        if not self.whole:
            raise OutputCutError(self.stream, self.received)


def _overlap(tail: bytes, mark: bytes) -> int:
    """The length of the longest suffix of ``tail`` that is a prefix of ``mark``."""
    for k in range(min(len(tail), len(mark)), 0, -1):
        if tail[len(tail) - k :] == mark[:k]:
            return k
    return 0


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended: ``code`` from the status channel, or ``None`` with the runtime's
    ``message`` when it ended without one.
    """

    code: int | None
    message: str = ""


def parse_status(raw: bytes | Mapping[str, Any]) -> ExitStatus:
    """The exit status in a status-channel ``Status`` object. ``Success`` is 0,
    ``NonZeroExitCode`` carries the code in a cause with reason ``ExitCode``; anything else
    means the command never ran (:class:`CommandNotStartedError`).
    """
    if isinstance(raw, (bytes, bytearray)):
        try:
            s = json.loads(raw)
        except ValueError as e:
            raise ProtocolError(f"bad status: {e}") from e
    else:
        s = raw
    if not isinstance(s, Mapping):
        raise ProtocolError("bad status: not an object")
    if s.get("status") == "Success":
        return ExitStatus(0)
    code: int | None = None
    causes = (s.get("details") or {}).get("causes") or []
    for c in causes:
        if c.get("reason") == "ExitCode":
            try:
                code = int(str(c.get("message", "")).strip())
                break
            except ValueError:
                continue
    reason = s.get("reason")
    if reason == "NonZeroExitCode":
        if code is not None:
            return ExitStatus(code)
        return ExitStatus(None, str(s.get("message") or ""))
    raise CommandNotStartedError(str(s.get("message") or reason or "exec failed without a message"))


class Capped:
    """A byte buffer that keeps at most ``cap`` bytes and remembers whether it dropped any."""

    __slots__ = ("buf", "cap", "truncated")

    def __init__(self, cap: int) -> None:
        self.buf = bytearray()
        self.cap = cap
        self.truncated = False

    def push(self, b: bytes | bytearray | memoryview) -> None:
        """Appends what fits; flags the rest as dropped."""
        room = self.cap - len(self.buf)
        if len(b) > room:
            self.truncated = True
            if room > 0:
                self.buf += b[:room]
        else:
            self.buf += b
