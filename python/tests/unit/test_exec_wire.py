"""Exec framing without a cluster: stdin frames and half-close, output events and their
trailers, exit status, caps, the session framer split at every position, and requests refused
before sending."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import aiohttp
import pytest

from agentbox import _wire
from agentbox.errors import (
    ApiError,
    CommandNotStartedError,
    InvalidRequestError,
    NotFoundError,
    OutputCutError,
    TransportError,
)
from agentbox.exec import CommandError, ExecResult, ExecStream, Exit, Output, _connect, _events
from agentbox.session import Framer, command_line, sh_quote


class FakeWs:
    """Plays back server messages and records what the client sends."""

    def __init__(
        self,
        messages: list[aiohttp.WSMessage],
        protocol: str = "v5.channel.k8s.io",
        lingers: bool = True,
    ) -> None:
        self.messages = messages
        # The status only after stdin ended, as the wrapper lingers until then (unless it was
        # killed, or never ran).
        self.lingers = lingers
        self.protocol = protocol
        self.sent: list[bytes] = []
        self.closed = False
        self.stdin_done = asyncio.Event()
        self.progress = asyncio.Event()

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:
        # Output only after stdin ended, as a command reading to EOF would, or after so many
        # bytes of it arrived, as the wrapper's trailer after a command reading K bytes.
        extra = self.messages[0].extra if self.messages else None
        first = self.messages[0] if self.messages else None
        if (
            first is not None
            and first.type == aiohttp.WSMsgType.BINARY
            and first.data[:1] == bytes((_wire.STATUS_CHANNEL,))
        ):
            if self.lingers:
                await self.stdin_done.wait()
        elif extra == "after-stdin":
            await self.stdin_done.wait()
        elif extra is not None and extra.startswith("after-bytes:"):
            while sum(len(f) - 1 for f in self.sent if f[0] == 0) < int(extra[12:]):
                self.progress.clear()
                await self.progress.wait()
        if not self.messages:
            await asyncio.sleep(3600)
        return self.messages.pop(0)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.progress.set()
        if data[:1] == bytes((_wire.CLOSE_CHANNEL,)):
            self.stdin_done.set()

    async def close(self) -> None:
        self.closed = True
        self.stdin_done.set()

    async def ping(self) -> None:
        pass


def binary(channel: int, data: bytes, extra: str | None = None) -> aiohttp.WSMessage:
    return aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, bytes((channel,)) + data, extra)


def status(code: int) -> aiohttp.WSMessage:
    if code == 0:
        obj: dict[str, Any] = {"status": "Success"}
    else:
        obj = {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    return binary(_wire.STATUS_CHANNEL, json.dumps(obj).encode())


MARK = "__AGENTBOX_00112233445566778899aabbccddeeff_"
CLOSE = bytes((_wire.CLOSE_CHANNEL, _wire.STDIN_CHANNEL))


def marks(extra: str | None = None) -> list[aiohttp.WSMessage]:
    """The wrapper's trailers, on stdout and stderr."""
    return [binary(1, MARK.encode(), extra), binary(2, MARK.encode())]


async def collect(
    ws: FakeWs,
    stdin: Any = None,
    timeout: float | None = None,
    cap: int = 1 << 20,
    linger: bool = True,
) -> ExecResult:
    events = _events(ws, stdin, timeout, MARK, linger)  # type: ignore[arg-type]
    return await ExecStream(events).collect(cap)


async def test_output_and_exit_code_come_from_their_channels() -> None:
    ws = FakeWs([binary(1, b"out"), binary(2, b"err"), binary(1, b"put"), *marks(), status(42)])
    r = await collect(ws)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (42, b"output", b"err", False)
    assert ws.closed
    # stdin is half-closed once both trailers arrived, which ends the wrapper's linger.
    assert ws.sent == [CLOSE]


async def test_large_stdin_goes_in_256_kib_frames_and_is_half_closed_after_the_trailers() -> None:
    data = bytes(range(256)) * 1200  # 300 KiB
    ws = FakeWs([binary(1, b"done", f"after-bytes:{len(data)}"), *marks(), status(0)])
    r = await collect(ws, stdin=data)
    assert r.stdout == b"done"
    frames = ws.sent
    assert [len(f) for f in frames] == [1 + _wire.STDIN_FRAME, 1 + len(data) - _wire.STDIN_FRAME, 2]
    assert all(f[0] == _wire.STDIN_CHANNEL for f in frames[:2])
    assert b"".join(f[1:] for f in frames[:2]) == data
    assert frames[2] == CLOSE


async def test_a_command_that_ends_early_stops_the_rest_of_its_stdin() -> None:
    async def endless() -> Any:
        while True:
            yield b"x" * 1000
            await asyncio.sleep(0)

    ws = FakeWs([binary(1, b"done", "after-bytes:3000"), *marks(), status(0)])
    r = await collect(ws, stdin=endless())
    assert r.stdout == b"done" and ws.sent[-1] == CLOSE


@pytest.mark.parametrize(
    ("messages", "stream", "received"),
    [
        ([binary(1, b"partial")], "stdout", 7),
        ([binary(1, b"partial" + MARK.encode()[:10])], "stdout", 17),
        ([binary(1, b"out" + MARK.encode())], "stderr", 0),
        ([binary(1, MARK.encode()), binary(1, b"late"), binary(2, MARK.encode())], "stdout", 48),
    ],
    ids=["no-mark", "half-a-mark", "stderr-cut", "output-after-the-mark"],
)
async def test_a_stream_without_its_trailer_is_cut_not_short(
    messages: list[aiohttp.WSMessage], stream: str, received: int
) -> None:
    ws = FakeWs([*messages, status(0)], lingers=False)
    with pytest.raises(OutputCutError) as e:
        await collect(ws)
    assert (e.value.stream, e.value.received) == (stream, received)


async def test_a_command_that_never_started_is_not_reported_as_cut() -> None:
    from agentbox.errors import CommandNotStartedError

    raw = {"status": "Failure", "reason": "InternalError", "message": "no container"}
    ws = FakeWs([binary(_wire.STATUS_CHANNEL, json.dumps(raw).encode())], lingers=False)
    with pytest.raises(CommandNotStartedError):
        await collect(ws)


async def test_a_trailer_split_across_messages_is_found_and_stripped() -> None:
    m = MARK.encode()
    ws = FakeWs(
        [
            binary(1, b"out" + m[:5]),
            binary(1, m[5:30]),
            binary(2, m[:1]),
            binary(1, m[30:]),
            binary(2, m[1:]),
            status(0),
        ]
    )
    r = await collect(ws)
    assert (r.stdout, r.stderr) == (b"out", b"")


@pytest.mark.parametrize(
    "source",
    [
        lambda: io.BytesIO(b"abc" * 100_000),
        lambda: iter([b"abc" * 50_000, b"abc" * 50_000]),
    ],
    ids=["file", "iterable"],
)
async def test_stdin_from_a_file_or_an_iterable(source: Any) -> None:
    ws = FakeWs([binary(1, b"x", "after-stdin"), *marks(), status(0)])
    await collect(ws, stdin=source(), linger=False)
    body = b"".join(f[1:] for f in ws.sent if f[0] == _wire.STDIN_CHANNEL)
    assert body == b"abc" * 100_000
    assert max(len(f) for f in ws.sent) <= 1 + _wire.STDIN_FRAME


async def test_async_iterable_stdin() -> None:
    async def chunks() -> Any:
        yield b"a"
        yield b"b"

    ws = FakeWs([binary(1, b"x", "after-stdin"), *marks(), status(0)])
    await collect(ws, stdin=chunks(), linger=False)
    assert ws.sent == [b"\x00a", b"\x00b", CLOSE]


async def test_output_past_the_cap_is_dropped_and_flagged() -> None:
    ws = FakeWs([binary(1, b"a" * 10), binary(2, b"b" * 3), *marks(), status(0)])
    r = await collect(ws, cap=4)
    assert (r.stdout, r.stdout_truncated, r.stderr, r.stderr_truncated) == (
        b"aaaa",
        True,
        b"bbb",
        False,
    )
    assert r.truncated


async def test_a_connection_closed_without_status_is_a_transport_error() -> None:
    ws = FakeWs([binary(1, b"x"), aiohttp.WSMessage(aiohttp.WSMsgType.CLOSE, 1000, "")])
    with pytest.raises(TransportError):
        await collect(ws)


async def test_a_status_after_the_deadline_is_marked_timed_out() -> None:
    class Slow(FakeWs):
        async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:
            if (
                not self.sent
                and timeout is not None
                and timeout > 0
                and not getattr(self, "waited", False)
            ):
                self.waited = True
                await asyncio.sleep(timeout)
                raise asyncio.TimeoutError
            return self.messages.pop(0)

    ws = Slow([*marks(), status(137)])
    r = await collect(ws, timeout=0.05)
    assert r.timed_out and r.exit_code == 137 and r.signal == 9


async def test_streamed_events_end_with_one_exit() -> None:
    ws = FakeWs([binary(1, b"a"), binary(2, b"b"), *marks(), status(3)])
    events = [
        ev
        async for ev in ExecStream(_events(ws, None, None, MARK, True))  # type: ignore[arg-type]
    ]
    assert events == [Output("stdout", b"a"), Output("stderr", b"b"), Exit(3, False, "")]


def test_result_helpers() -> None:
    r = ExecResult(2, b"o\xff", b"e")
    assert not r.ok and r.signal is None
    assert r.stdout_text() == "o\ufffd"
    with pytest.raises(CommandError) as e:
        r.check()
    assert e.value.result is r
    assert ExecResult(0, b"", b"").check().ok


@pytest.mark.parametrize(
    ("command", "kwargs"),
    [
        ([], {}),
        (["true"], {"env": {"1A": "x"}}),
        (["true"], {"timeout": -1}),
        (["true"], {"timeout": float("nan")}),
        (["true"], {"max_output": -5}),
        ([1, 2], {}),
    ],
)
def test_bad_requests_are_refused_before_sending(command: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        argv = _wire.command_argv(command)
        _wire.validate(argv, kwargs.get("timeout"), kwargs.get("env"), kwargs.get("max_output", 0))


def test_a_shell_string_runs_under_sh() -> None:
    assert _wire.command_argv("ls; exit 3") == ["sh", "-c", "ls; exit 3"]


def test_command_line_quotes_everything() -> None:
    line = command_line(["echo", "it's", "$HOME"], "__M_")
    assert "( exec 'echo' 'it'\\''s' '$HOME' ) </dev/null" in line
    assert line.endswith("\n") and line.count("\n") == 1
    assert sh_quote("") == "''"


def test_sentinels_split_across_chunks_at_every_position() -> None:
    start, end = b"__AGENTBOX_ab_+\n", "__AGENTBOX_ab_"
    stream = b"xx__AGENTBOX_ab_+\nout\nput no newline__AGENTBOX_ab_7\nrest"
    for i in range(len(stream)):
        for j in range(i, len(stream)):
            f = Framer(start, end, 1000)
            got = None
            parts = [stream[:i], stream[i:j], stream[j:]]
            for k, part in enumerate(parts):
                got = f.feed(part)
                if got is not None:
                    trailer, rest = got
                    rest += b"".join(parts[k + 1 :])
                    break
            assert got is not None, (i, j)
            assert (trailer, bytes(f.out.buf), rest) == ("7", b"out\nput no newline", b"rest"), (
                i,
                j,
            )


def test_capped_output_keeps_the_frame_bounded() -> None:
    f = Framer(None, "END", 4)
    assert f.feed(b"a" * 10_000) is None
    assert f.feed(b"END\n") == ("", b"")
    assert bytes(f.out.buf) == b"aaaa" and f.out.truncated
    assert len(f.buf) < 10


class RefusingKube:
    """A Kube whose exec handshake is refused with a 400 and whose pod is ``pod``."""

    def __init__(self, pod: dict[str, Any] | None) -> None:
        self.pod = pod

    async def ws_connect(self, *args: Any) -> Any:
        raise ApiError(400, "", "pod ns/p (exec): Invalid response status")

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        assert path == "/api/v1/namespaces/ns/pods/p"
        return self.pod


@pytest.mark.parametrize(
    ("pod", "error", "says"),
    [
        # A replacement pod not yet scheduled or started: the command never started.
        ({"spec": {}, "status": {"phase": "Pending"}}, CommandNotStartedError, "not on a node"),
        (
            {"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}},
            CommandNotStartedError,
            "Pending",
        ),
        # Gone meanwhile: as a 404 on the handshake.
        (None, NotFoundError, "not found"),
        # A running pod refusing the exec: the API's refusal, as it came.
        ({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}}, ApiError, "400"),
    ],
)
async def test_a_refused_exec_handshake_says_whether_the_pod_was_not_running(
    pod: dict[str, Any] | None, error: type[Exception], says: str
) -> None:
    kube: Any = RefusingKube(pod)
    with pytest.raises(error, match=says):
        await _connect(kube, "ns", "p", "sandbox", ["true"], stdin=False)
