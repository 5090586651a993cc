"""One-shot exec in a sandbox pod over ``pods/exec`` (WebSocket, ``v5.channel.k8s.io``): the
real exit code from the status channel, a timeout that kills the command's whole process group
in the pod, per-stream output caps, stdin from bytes, a file or an (async) iterable in 256 KiB
frames, and a streaming form.

Every command runs under the wrapper of docs/protocol.md ("Exec"): its output ends with a
fresh random mark on each stream, which is stripped here, and the wrapper exits only after
this side has read both marks and half-closed stdin. A stream without its mark was cut on the
way (kubernetes/kubernetes#124571): :class:`~agentbox.errors.OutputCutError`, never a short
result.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, Any, Literal, Union

import aiohttp

from . import _wire
from ._kube import Kube, pod_exec_path, pod_path
from .errors import (
    AgentboxError,
    ApiError,
    CommandNotStartedError,
    ExecError,
    NotFoundError,
    OutOfMemoryError,
    OutputCutError,
    ProtocolError,
    RemoteError,
    TransportError,
)

__all__ = [
    "CommandError",
    "ExecEvent",
    "ExecResult",
    "ExecStream",
    "ExecTimeoutError",
    "Exit",
    "Output",
    "StdinSource",
]

#: What ``stdin=`` accepts: bytes or text (UTF-8), a binary file object (read in a worker
#: thread), or an iterable / async iterable of byte chunks. It is sent, then closed. Bytes and
#: text are a known length (the command reads exactly those); the others are a stream read to
#: its end.
StdinSource = Union[
    bytes, bytearray, memoryview, str, IO[bytes], Iterable[bytes], AsyncIterable[bytes]
]


@dataclass(frozen=True)
class ExecResult:
    """The collected result of a command."""

    #: Exit code from the status channel; ``None`` when the runtime reported none.
    exit_code: int | None
    #: stdout, at most ``max_output`` bytes.
    stdout: bytes
    #: stderr, at most ``max_output`` bytes.
    stderr: bytes
    #: stdout was longer than the cap; the rest was dropped.
    stdout_truncated: bool = False
    #: stderr was longer than the cap; the rest was dropped.
    stderr_truncated: bool = False
    #: The timeout passed before the command ended (it was killed).
    timed_out: bool = False
    #: The runtime's message when there is no exit code.
    status_message: str = ""

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """Either stream was cut at the cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def signal(self) -> int | None:
        """N when the exit code is 128+N (the shell's convention for a killed process; the
        container runtime reports signals this way).
        """
        c = self.exit_code
        return c - 128 if c is not None and 129 <= c <= 192 else None

    def stdout_text(self) -> str:
        """Stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", errors="replace")

    def stderr_text(self) -> str:
        """Stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr.decode("utf-8", errors="replace")

    def check(self) -> ExecResult:
        """Returns itself if the exit code is 0, else raises :class:`CommandError`."""
        if self.exit_code != 0:
            raise CommandError(self)
        return self


class ExecTimeoutError(ExecError, TimeoutError):
    """The command's timeout passed; it was killed (its whole process group).

    ``result`` holds what it printed until then and the exit status reported after the kill
    (``None`` when no status arrived at all).
    """

    def __init__(self, message: str, result: ExecResult | None) -> None:
        super().__init__(message)
        #: Output up to the kill, or ``None``.
        self.result = result


class CommandError(ExecError):
    """A command run with ``check=True`` exited non-zero; ``result`` has its output."""

    def __init__(self, result: ExecResult) -> None:
        super().__init__(
            f"command exited with code {result.exit_code}: {result.stderr_text()[-500:]}"
        )
        #: The command's result.
        self.result = result


@dataclass(frozen=True)
class Output:
    """A chunk of a command's output."""

    #: ``"stdout"`` or ``"stderr"``.
    stream: Literal["stdout", "stderr"]
    #: The bytes.
    data: bytes


@dataclass(frozen=True)
class Exit:
    """The end of a streamed command; always the last event."""

    #: Exit code, or ``None`` when the runtime reported none.
    exit_code: int | None
    #: The timeout passed before it ended.
    timed_out: bool
    #: The runtime's message when there is no exit code.
    status_message: str = ""


#: WebSocket message types that end a connection.
CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)

#: One event of :class:`ExecStream`.
ExecEvent = Union[Output, Exit]


async def _connect(
    kube: Kube, namespace: str, pod: str, container: str, argv: Sequence[str], stdin: bool
) -> aiohttp.ClientWebSocketResponse[bool]:
    query = [
        ("container", container),
        ("stdin", "true" if stdin else "false"),
        ("stdout", "true"),
        ("stderr", "true"),
    ]
    query.extend(("command", a) for a in argv)
    try:
        return await kube.ws_connect(
            pod_exec_path(namespace, pod), query, _wire.PROTOCOLS, f"pod {namespace}/{pod} (exec)"
        )
    except ApiError as e:
        if e.status != 400:
            raise
        # The handshake's 400 carries no body here; the usual cause is a pod that is not
        # running yet ("does not have a host assigned": a replacement pod still Pending). Ask
        # the pod, so that case reads as a command that never started, which callers may retry.
        found = await kube.get_opt(pod_path(namespace, pod))
        if found is None:
            raise NotFoundError(f"pod {namespace}/{pod} (exec) not found") from e
        why = not_running(found)
        if why is None:
            raise
        raise CommandNotStartedError(f"pod {namespace}/{pod} {why}") from e


def not_running(pod: Mapping[str, Any]) -> str | None:
    """Why a pod cannot run a command yet (pure): ``None`` when it is running, else what it is
    (not yet on a node, or in a phase other than Running).
    """
    if not (pod.get("spec") or {}).get("nodeName"):
        return "is not on a node yet"
    phase = (pod.get("status") or {}).get("phase") or "Unknown"
    return None if phase == "Running" else f"is {phase}, not Running"


def _next_chunk(it: Iterator[bytes]) -> bytes | None:
    return next(it, None)


async def _frames(src: StdinSource) -> AsyncIterator[bytes]:
    """Stdin as chunks of at most one frame."""
    if isinstance(src, str):
        src = src.encode()
    if isinstance(src, (bytes, bytearray, memoryview)):
        view = memoryview(src)
        for i in range(0, len(view), _wire.STDIN_FRAME):
            yield bytes(view[i : i + _wire.STDIN_FRAME])
        return
    if hasattr(src, "read"):
        f: IO[bytes] = src  # type: ignore[assignment]
        while True:
            chunk = await asyncio.to_thread(f.read, _wire.STDIN_FRAME)
            if not chunk:
                return
            yield bytes(chunk)
    if isinstance(src, AsyncIterable):
        async for chunk in src:
            for i in range(0, len(chunk), _wire.STDIN_FRAME):
                yield bytes(chunk[i : i + _wire.STDIN_FRAME])
        return
    it = iter(src)
    while True:
        # A sync iterable may block (a generator reading a file): advance it off the loop.
        nxt = await asyncio.to_thread(_next_chunk, it)
        if nxt is None:
            return
        for i in range(0, len(nxt), _wire.STDIN_FRAME):
            yield bytes(nxt[i : i + _wire.STDIN_FRAME])


def _stdin_bytes(src: StdinSource | None) -> bytes | None:
    """``src`` as bytes when it is of known length (bytes or text), else ``None``."""
    if isinstance(src, str):
        return src.encode()
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    return None


async def _send_stdin(
    ws: aiohttp.ClientWebSocketResponse[bool],
    src: StdinSource | None,
    linger: bool,
    all_read: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    """Sends stdin, then half-closes it (a v5 CLOSE frame; output keeps flowing): at its end
    when the wrapper does not linger (a stream, ``=``), otherwise once ``all_read`` says both
    trailers arrived, which also stops what is left of the data (the command has ended). A
    failing stdin source ends stdin like EOF; the command's exit status still comes back.
    """

    async def data() -> bool:
        if src is None:
            return True
        try:
            async for chunk in _frames(src):
                await ws.send_bytes(bytes((_wire.STDIN_CHANNEL,)) + chunk)
        except (aiohttp.ClientError, ConnectionError):
            return False
        except Exception:  # a failing stdin source: end stdin, let the command finish
            pass
        return True

    sending = asyncio.ensure_future(data())
    waiting = asyncio.ensure_future(all_read.wait())
    # ExecStream.kill: stop sending and half-close stdin, so the wrapper ends with the command.
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({sending, waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if sending.done() and not sending.result():
            return
        if linger and not all_read.is_set() and not stop.is_set():
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (sending, waiting, stopping):
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    with contextlib.suppress(aiohttp.ClientError, ConnectionError):
        await ws.send_bytes(bytes((_wire.CLOSE_CHANNEL, _wire.STDIN_CHANNEL)))


async def _events(
    ws: aiohttp.ClientWebSocketResponse[bool],
    stdin: StdinSource | None,
    timeout: float | None,
    mark: str,
    linger: bool,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[ExecEvent]:
    """Pumps one exec connection: stdin out, output chunks in (their trailers held back and
    stripped), then the exit status, or :class:`~agentbox.errors.OutputCutError` when a
    stream lacks its mark.
    """
    loop = asyncio.get_running_loop()
    all_read = asyncio.Event()
    sender = asyncio.ensure_future(
        _send_stdin(ws, stdin, linger, all_read, stop or asyncio.Event())
    )
    out = _wire.Trailer(mark, "stdout")
    err = _wire.Trailer(mark, "stderr")
    start = loop.time()
    deadline = None if timeout is None else start + timeout
    give_up: float | None = None
    try:
        while True:
            now = loop.time()
            wait = _wire.PING_EVERY
            if deadline is not None and give_up is None:
                wait = min(wait, deadline - now)
            if give_up is not None:
                wait = min(wait, give_up - now)
            try:
                if wait <= 0:
                    raise asyncio.TimeoutError
                msg = await ws.receive(timeout=wait)
            except asyncio.TimeoutError:
                now = loop.time()
                if deadline is not None and give_up is None and now >= deadline:
                    give_up = now + _wire.TIMEOUT_GRACE
                elif give_up is not None and now >= give_up:
                    raise ExecTimeoutError(
                        f"command timed out after {timeout}s and no exit status arrived", None
                    ) from None
                else:
                    with contextlib.suppress(Exception):
                        await ws.ping()
                continue
            if msg.type == aiohttp.WSMsgType.BINARY:
                data: bytes = msg.data
                if len(data) < 2:
                    continue
                ch = data[0]
                if ch == _wire.STDOUT_CHANNEL or ch == _wire.STDERR_CHANNEL:
                    name: Literal["stdout", "stderr"] = (
                        "stdout" if ch == _wire.STDOUT_CHANNEL else "stderr"
                    )
                    passed = (out if name == "stdout" else err).push(data[1:])
                    if out.whole and err.whole:
                        all_read.set()
                    if passed:
                        yield Output(name, passed)
                elif ch == _wire.STATUS_CHANNEL:
                    # A command that never started has no trailer to miss.
                    st = _wire.parse_status(data[1:])
                    out.check()
                    err.check()
                    if out.memory or err.memory:
                        raise OutOfMemoryError(False)
                    # The client's deadline starts before the in-pod watchdog's, so a command
                    # the watchdog killed is always seen as timed out here.
                    timed_out = give_up is not None or (
                        timeout is not None and loop.time() - start >= timeout
                    )
                    yield Exit(st.code, timed_out, st.message)
                    return
            elif msg.type == aiohttp.WSMsgType.ERROR:
                raise TransportError(f"exec stream failed: {ws.exception()!r}")
            elif msg.type in CLOSED:
                raise TransportError("exec stream failed: connection closed without an exit status")
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
        await ws.close()


class ExecStream:
    """A running command's events: :class:`Output` chunks as they arrive, then one
    :class:`Exit`. Use it as an async context manager and iterate it. Leaving it closes the
    connection, which does not stop the command (one that ignores the end of its stdin keeps
    running in the pod, unless it had a timeout): :meth:`kill` does.
    """

    def __init__(
        self,
        events: AsyncIterator[ExecEvent],
        kill: Callable[[], Awaitable[None]] | None = None,
        process_id: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._events = events
        self._kill = kill
        self._stop = stop
        #: The command's ``AGENTBOX_PROCESS`` id, which what it starts inherits.
        self.process_id = process_id

    async def kill(self) -> None:
        """Kills the command and every process it started that carries its
        ``AGENTBOX_PROCESS`` entry, in the pod, whatever their process group (a second exec),
        then half-closes its stdin, so the stream goes on to its :class:`Exit` (code 137):
        read it to the end. A second call does nothing.
        """
        kill, self._kill = self._kill, None
        if kill is None:
            return
        try:
            await kill()
        finally:
            if self._stop is not None:
                self._stop.set()

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        return self._events

    async def __aenter__(self) -> ExecStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connection."""
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()

    async def collect(self, max_output: int = _wire.DEFAULT_MAX_OUTPUT) -> ExecResult:
        """Reads the stream to its end, keeping at most ``max_output`` bytes per stream."""
        out, err = _wire.Capped(max_output), _wire.Capped(max_output)
        try:
            async for ev in self._events:
                if isinstance(ev, Output):
                    (out if ev.stream == "stdout" else err).push(ev.data)
                else:
                    return ExecResult(
                        ev.exit_code,
                        bytes(out.buf),
                        bytes(err.buf),
                        out.truncated,
                        err.truncated,
                        ev.timed_out,
                        ev.status_message,
                    )
        finally:
            await self.aclose()
        raise ProtocolError("exec stream ended without an exit status")


async def stream(
    kube: Kube,
    namespace: str,
    pod: str,
    command: str | Sequence[str],
    *,
    stdin: StdinSource | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    container: str = _wire.SANDBOX_CONTAINER,
) -> ExecStream:
    """Starts a command; the connection is open when this returns (connection errors are
    raised here, not from the stream). The stream ends with :class:`Exit`, or raises
    :class:`~agentbox.errors.OutputCutError` after the chunks that did arrive when the output
    was cut on the way.
    """
    known = _stdin_bytes(stdin)
    mode = _wire.stdin_mode(None if stdin is None else -1 if known is None else len(known))
    mark = _wire.new_mark()
    pid = _wire.new_mark()[len("__AGENTBOX_") : -1]
    env = {**(env or {}), _wire.PROCESS_ENV: pid}
    argv = _wire.remote_argv(_wire.command_argv(command), timeout, cwd, env, mark=mark, stdin=mode)
    # stdin is always open: the wrapper lingers on it until both trailers have arrived here.
    ws = await _connect(kube, namespace, pod, container, argv, True)
    if ws.protocol != _wire.PROTOCOLS[0]:
        await ws.close()
        raise TransportError(
            f"the API server spoke {ws.protocol}; agentbox exec needs {_wire.PROTOCOLS[0]}"
            " (Kubernetes 1.30 or later)"
        )
    src = None if mode == "-" else known if known is not None else stdin
    stop = asyncio.Event()

    async def kill() -> None:
        r = await run(
            kube,
            namespace,
            pod,
            ["sh", "-c", _wire.PROCESSES, "sh", "kill", pid],
            container=container,
        )
        if r.exit_code != 0:
            raise RemoteError(
                r.exit_code,
                "killing the command's processes in the pod failed: "
                + r.stderr.decode(errors="replace").strip(),
            )

    return ExecStream(_events(ws, src, timeout, mark, mode != "=", stop), kill, pid, stop)


async def run(
    kube: Kube,
    namespace: str,
    pod: str,
    command: str | Sequence[str],
    *,
    stdin: StdinSource | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    max_output: int = _wire.DEFAULT_MAX_OUTPUT,
    check: bool = False,
    container: str = _wire.SANDBOX_CONTAINER,
) -> ExecResult:
    """Runs a command to completion. Raises :class:`ExecTimeoutError` (with the output so far)
    when ``timeout`` passed, :class:`CommandError` for a non-zero exit with ``check``, and
    :class:`~agentbox.errors.OutputCutError` when output was lost on the way (never a short
    result). Output past ``max_output`` is still read (to find the trailer) and dropped.
    """
    _wire.validate(_wire.command_argv(command), timeout, env, max_output)
    since = datetime.now(timezone.utc)
    try:
        s = await stream(
            kube,
            namespace,
            pod,
            command,
            stdin=stdin,
            timeout=timeout,
            cwd=cwd,
            env=env,
            container=container,
        )
        result = await s.collect(max_output)
    except (TransportError, OutputCutError, CommandNotStartedError) as e:
        if await container_killed_since(kube, namespace, pod, container, since):
            raise OutOfMemoryError(True) from e
        raise
    if result.timed_out:
        raise ExecTimeoutError(f"command timed out after {timeout}s", result)
    return result.check() if check else result


async def container_killed_since(
    kube: Kube, namespace: str, pod: str, container: str, since: datetime
) -> bool:
    """Whether the kubelet records ``container`` of ``pod`` killed for memory since ``since``
    (:func:`agentbox._wire.oom_killed_since`), looking for up to ``OOM_SETTLE`` seconds: the
    check after an exec that failed as a dead container makes it fail. A pod that cannot be
    read (gone, or the API server out of reach) is not known to be out of memory: no at once.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + _wire.OOM_SETTLE
    while True:
        try:
            obj = await kube.get_opt(pod_path(namespace, pod))
        except AgentboxError:
            # The API server out of reach: not known (and no settle time added to the error).
            return False
        if obj is None:
            return False
        if _wire.oom_killed_since(obj, container, since):
            return True
        if loop.time() + _wire.OOM_POLL > until:
            return False
        await asyncio.sleep(_wire.OOM_POLL)
