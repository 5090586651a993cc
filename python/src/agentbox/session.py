"""A persistent shell in a sandbox: one long-lived ``sh`` over one exec with stdin open, for
tool loops where a new exec per command (a WebSocket upgrade through the API server and the
kubelet) costs too much.

The framing is the Rust crate's (``agentbox_api::exec::session``, checked against its vectors):
each command is one line that runs it in a subshell with stdin from ``/dev/null``, framed by
sentinels carrying a fresh random nonce — a start sentinel on stdout, the output, then an end
sentinel with ``$?`` on stdout and one on stderr. State does not carry over between commands
(use ``cwd`` and ``env``). A shell found dead before a command starts is replaced and the
command sent again (once); one that dies while a command runs fails it with
:class:`~agentbox.errors.SessionError` and the next command gets a new shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

import aiohttp

from . import _wire
from ._kube import KubeSource
from .errors import (
    CommandNotStartedError,
    OutOfMemoryError,
    ProtocolError,
    SessionError,
    TransportError,
)
from .exec import CLOSED, ExecResult, ExecTimeoutError, _connect, container_killed_since

__all__ = ["Session"]

#: Longest trailer accepted after an end sentinel.
MAX_TRAILER = 32


def sh_quote(s: str) -> str:
    """Single-quotes ``s`` for ``sh``."""
    return "'" + s.replace("'", "'\\''") + "'"


def command_line(argv: Sequence[str], mark: str) -> str:
    """The line written to the shell for one command (``argv`` as :func:`_wire.session_argv`
    made it: the session's shell outlives the command, so it needs no trailer of its own).
    """
    cmd = " ".join(sh_quote(a) for a in argv)
    oom = _wire.SESSION_OOM
    # The end sentinel carries the exit code, and ``!`` after it when the command died of
    # SIGKILL with the container's OOM kill counter risen meanwhile.
    return (
        f"printf '%s+\\n' '{mark}'; {oom} _ab_o=$_ab_k; ( exec {cmd} ) </dev/null; "
        f'_ab_r=$?; _ab_m=; if [ $_ab_r = 137 ] && [ -n "$_ab_o" ]; then {oom} '
        f'[ -n "$_ab_k" ] && [ "$_ab_k" -gt "$_ab_o" ] 2>/dev/null && '
        f"_ab_m='{_wire.MEMORY_FLAG}'; fi; "
        f"printf '%s%d%s\\n' '{mark}' \"$_ab_r\" \"$_ab_m\"; printf '%s\\n' '{mark}' >&2\n"
    )


def _find(hay: bytearray, needle: bytes) -> int:
    if not needle or len(hay) < len(needle):
        return -1
    return hay.find(needle)


class Framer:
    """Incremental parser of one command's frame on one stream: skips to the start sentinel
    (if any), collects output (capped) up to the end sentinel, then takes the text up to the
    next newline as the trailer (the exit code on stdout, empty on stderr). Memory stays
    bounded by the cap plus a sentinel's length.
    """

    def __init__(self, start: bytes | None, end: str, cap: int) -> None:
        self.start = start
        self.end = end.encode()
        self.buf = bytearray()
        self.out = _wire.Capped(cap)

    @property
    def awaiting_start(self) -> bool:
        """Whether the start sentinel is still to come."""
        return self.start is not None

    def feed(self, data: bytes | bytearray) -> tuple[str, bytes] | None:
        """Feeds bytes; returns the trailer and the bytes after the frame once complete."""
        self.buf += data
        if self.start is not None:
            p = _find(self.buf, self.start)
            if p < 0:
                # Stray output of earlier commands' background jobs: drop it, keeping a
                # possible sentinel prefix.
                keep = min(len(self.start) - 1, len(self.buf))
                del self.buf[: len(self.buf) - keep]
                return None
            del self.buf[: p + len(self.start)]
            self.start = None
        p = _find(self.buf, self.end)
        if p < 0:
            keep = min(len(self.end) - 1, len(self.buf))
            n = len(self.buf) - keep
            self.out.push(self.buf[:n])
            del self.buf[:n]
            return None
        self.out.push(self.buf[:p])
        after = self.buf[p + len(self.end) :]
        nl = after.find(b"\n")
        if nl < 0:
            if len(after) > MAX_TRAILER:
                raise SessionError("malformed frame trailer from the shell")
            del self.buf[:p]
            return None
        trailer = after[:nl].decode("utf-8", errors="replace")
        rest = bytes(after[nl + 1 :])
        self.buf.clear()
        return trailer, rest


class _NotStartedError(Exception):
    """The command certainly did not start (the shell was gone before its start sentinel)."""


class _Shell:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse[bool]) -> None:
        self.ws = ws
        self.out_pending = b""
        self.err_pending = b""


class Session:
    """A persistent shell in one sandbox pod. Commands run one at a time (concurrent
    :meth:`run` calls queue); the shell starts with the first command. Use it as an async
    context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        kube: KubeSource,
        namespace: str,
        pod: str,
        *,
        cwd: str | None = None,
        container: str = _wire.SANDBOX_CONTAINER,
    ) -> None:
        self._kube = kube
        self._ns = namespace
        self._pod = pod
        self._cwd = cwd
        self._container = container
        self._shell: _Shell | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Starts the shell now rather than with the first command."""
        async with self._lock:
            if self._shell is None or self._shell.ws.closed:
                self._shell = await self._spawn()

    async def _spawn(self) -> _Shell:
        ws = await _connect(
            await self._kube(),
            self._ns,
            self._pod,
            self._container,
            _wire.session_shell_argv(self._cwd),
            True,
        )
        return _Shell(ws)

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        max_output: int = _wire.DEFAULT_MAX_OUTPUT,
        check: bool = False,
    ) -> ExecResult:
        """Runs one command in the shell (no stdin: use a one-shot exec for that). The timeout
        kills the command's process group as in one-shot exec and raises
        :class:`~agentbox.exec.ExecTimeoutError`.
        """
        argv = _wire.command_argv(command)
        _wire.validate(argv, timeout, env, max_output)
        mark = f"__AGENTBOX_{secrets.token_hex(16)}_"
        # The shell already runs in the session's cwd: only a command's own cwd is sent.
        line = command_line(_wire.session_argv(argv, timeout, cwd, env), mark)
        since = datetime.now(timezone.utc)
        try:
            result = await self._run_locked(line, mark, timeout, max_output)
        except (SessionError, TransportError, CommandNotStartedError) as e:
            # A shell that died with its container: the kubelet may say it was out of memory.
            kube = await self._kube()
            if await container_killed_since(kube, self._ns, self._pod, self._container, since):
                raise OutOfMemoryError(True) from e
            raise
        if result.timed_out:
            raise ExecTimeoutError(f"command timed out after {timeout}s", result)
        return result.check() if check else result

    async def _run_locked(
        self, line: str, mark: str, timeout: float | None, max_output: int
    ) -> ExecResult:
        async with self._lock:
            for attempt in (1, 2):
                try:
                    return await self._run_once(line, mark, timeout, max_output)
                except _NotStartedError as e:
                    await self._drop()
                    if attempt == 2:
                        raise SessionError(f"the command did not start: {e}") from None
                except BaseException:
                    # The frames may be out of step now: this shell cannot be trusted.
                    await self._drop()
                    raise
        raise SessionError("the command did not start")

    async def _drop(self) -> None:
        sh, self._shell = self._shell, None
        if sh is not None:
            await sh.ws.close()

    async def _run_once(self, line: str, mark: str, timeout: float | None, cap: int) -> ExecResult:
        if self._shell is None or self._shell.ws.closed:
            self._shell = None
            self._shell = await self._spawn()
        sh = self._shell
        try:
            await sh.ws.send_bytes(bytes((_wire.STDIN_CHANNEL,)) + line.encode())
        except (aiohttp.ClientError, ConnectionError) as e:
            raise _NotStartedError(f"writing the command: {e!r}") from None
        out = Framer(f"{mark}+\n".encode(), mark, cap)
        err = Framer(None, mark, cap)
        loop = asyncio.get_running_loop()
        started = loop.time()
        work = self._read_frames(sh, out, err)
        if timeout is None:
            code = await work
        else:
            try:
                # The in-pod watchdog kills the command at the timeout; the grace only bounds
                # a wedged connection.
                code = await asyncio.wait_for(work, timeout + _wire.TIMEOUT_GRACE)
            except asyncio.TimeoutError:
                raise ExecTimeoutError(
                    f"command timed out after {timeout}s and no exit status arrived", None
                ) from None
        parsed = _wire.parse_session_end(code)
        if parsed is not None and parsed[1]:
            raise OutOfMemoryError(False)
        exit_code: int | None = parsed[0] if parsed is not None else None
        message = "" if parsed is not None else f"unparsable status {code!r}"
        return ExecResult(
            exit_code,
            bytes(out.out.buf),
            bytes(err.out.buf),
            out.out.truncated,
            err.out.truncated,
            timeout is not None and loop.time() - started >= timeout,
            message,
        )

    async def _read_frames(self, sh: _Shell, out: Framer, err: Framer) -> str:
        """Feeds the shell's output to both framers until both frames are complete; returns
        the stdout trailer (the exit code).
        """
        code: str | None = None
        err_done = False
        for framer, pending in ((out, sh.out_pending), (err, sh.err_pending)):
            if pending:
                done = framer.feed(pending)
                if done is not None:
                    if framer is out:
                        code, sh.out_pending = done
                    else:
                        err_done, sh.err_pending = True, done[1]
                elif framer is out:
                    sh.out_pending = b""
                else:
                    sh.err_pending = b""
        while code is None or not err_done:
            msg = await sh.ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                data: bytes = msg.data
                if len(data) < 2:
                    continue
                ch = data[0]
                if ch == _wire.STDOUT_CHANNEL:
                    if code is None:
                        done = out.feed(data[1:])
                        if done is not None:
                            code, sh.out_pending = done
                    else:
                        sh.out_pending += data[1:]
                elif ch == _wire.STDERR_CHANNEL:
                    if not err_done:
                        done = err.feed(data[1:])
                        if done is not None:
                            err_done, sh.err_pending = True, done[1]
                    else:
                        sh.err_pending += data[1:]
                elif ch == _wire.STATUS_CHANNEL:
                    await sh.ws.close()
                    self._died(out, err, self._cwd)
            elif msg.type in CLOSED or msg.type == aiohttp.WSMsgType.ERROR:
                self._died(out, err, self._cwd)
            else:
                raise ProtocolError(f"unexpected message from the shell: {msg.type!r}")
        return code

    @staticmethod
    def _died(out: Framer, err: Framer, cwd: str | None) -> None:
        if out.awaiting_start:
            # The directory named here: what the shell said on stderr may be cut by its exit.
            why = "the shell exited" + (f" (started in {cwd})" if cwd else "")
            said = bytes(err.out.buf).decode(errors="replace").strip()
            raise _NotStartedError(f"{why}: {said}" if said else why)
        raise SessionError("the shell exited while a command ran; it may have run in part")

    async def close(self) -> None:
        """Ends the shell (closing its stdin lets it exit)."""
        async with self._lock:
            sh, self._shell = self._shell, None
        if sh is not None and not sh.ws.closed:
            if sh.ws.protocol == _wire.PROTOCOLS[0]:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    await sh.ws.send_bytes(bytes((_wire.CLOSE_CHANNEL, _wire.STDIN_CHANNEL)))
            await sh.ws.close()
