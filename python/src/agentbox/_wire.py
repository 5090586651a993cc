"""The pure parts of exec, mirroring the Rust crate's ``agentbox::exec`` byte for byte (and
checked against its vectors): the remote-command channels, the ``sh`` wrapper that gives a
command a workdir, environment and a timeout that really kills it, and the exit status read
from the status channel.

Why the wire protocol is spoken here rather than through ``kubernetes_asyncio.stream``: that
client reads the whole output as UTF-8 text, speaks only ``v4.channel.k8s.io`` (no stdin
half-close, so ``tar -x`` and ``cat > file`` cannot see EOF) and reduces the status to the
first cause's message; the SDK needs bytes, half-close, caps and the real exit code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import CommandNotStartedError, InvalidRequestError, ProtocolError

#: The container of every sandbox pod.
SANDBOX_CONTAINER = "sandbox"
#: Subprotocols offered, preferred first: v5 can half-close stdin.
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
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

#: The ``sh`` prologue for a command with a workdir, env or timeout (the Rust crate's
#: ``exec::WRAPPER``; see its doc comment). Positional parameters: ``$1`` timeout in seconds
#: (empty: none), ``$2`` workdir (empty: keep), ``$3`` number of ``NAME=value`` entries that
#: follow, then the entries, then the argv. With a timeout the command runs in its own process
#: group, which a watchdog kills when the time is up.
WRAPPER = """t=$1; d=$2; n=$3; shift 3
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done
if [ -n "$d" ]; then cd -- "$d" || exit 126; fi
if [ -z "$t" ]; then exec "$@"; fi
exec 3<&0
setsid "$@" <&3 3<&- &
p=$!
exec 3<&-
( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "$t" & s=$!; wait $s && kill -s KILL -- -$p ) </dev/null >/dev/null 2>&1 &
w=$!
wait $p 2>/dev/null; r=$?
kill -0 -- -$p 2>/dev/null || kill $w 2>/dev/null
exit $r
"""


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


def remote_argv(
    argv: Sequence[str],
    timeout: float | None = None,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The argv sent to the container: the command itself when it needs no prologue,
    otherwise ``sh -c WRAPPER`` with the settings as positional parameters.
    """
    validate(argv, timeout, env, 0)
    env = env or {}
    if timeout is None and workdir is None and not env:
        return list(argv)
    out = [
        "sh",
        "-c",
        WRAPPER,
        "agentbox-exec",
        "" if timeout is None else sleep_arg(timeout),
        workdir or "",
        str(len(env)),
    ]
    out.extend(f"{k}={v}" for k, v in env.items())
    out.extend(argv)
    return out


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
