"""Exec framing without a cluster: stdin frames and half-close, output events, exit status,
caps, the session framer split at every position, and requests refused before sending."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import aiohttp
import pytest

from agentbox import _wire
from agentbox.errors import InvalidRequestError, TransportError
from agentbox.exec import CommandError, ExecResult, ExecStream, Exit, Output, _events
from agentbox.session import Framer, command_line, sh_quote


class FakeWs:
    """Plays back server messages and records what the client sends."""

    def __init__(
        self, messages: list[aiohttp.WSMessage], protocol: str = "v5.channel.k8s.io"
    ) -> None:
        self.messages = messages
        self.protocol = protocol
        self.sent: list[bytes] = []
        self.closed = False
        self.stdin_done = asyncio.Event()

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:
        # Output only after stdin ended, as a command reading to EOF would.
        if self.messages and self.messages[0].extra == "after-stdin":
            await self.stdin_done.wait()
        if not self.messages:
            await asyncio.sleep(3600)
        return self.messages.pop(0)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(bytes(data))
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


async def collect(
    ws: FakeWs, stdin: Any = None, timeout: float | None = None, cap: int = 1 << 20
) -> ExecResult:
    return await ExecStream(_events(ws, stdin, timeout)).collect(cap)  # type: ignore[arg-type]


async def test_output_and_exit_code_come_from_their_channels() -> None:
    ws = FakeWs([binary(1, b"out"), binary(2, b"err"), binary(1, b"put"), status(42)])
    r = await collect(ws)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (42, b"output", b"err", False)
    assert ws.closed


async def test_large_stdin_goes_in_256_kib_frames_then_a_v5_half_close() -> None:
    data = bytes(range(256)) * 1200  # 300 KiB
    ws = FakeWs([binary(1, b"done", "after-stdin"), status(0)])
    r = await collect(ws, stdin=data)
    assert r.stdout == b"done"
    frames = ws.sent
    assert [len(f) for f in frames] == [1 + _wire.STDIN_FRAME, 1 + len(data) - _wire.STDIN_FRAME, 2]
    assert all(f[0] == _wire.STDIN_CHANNEL for f in frames[:2])
    assert b"".join(f[1:] for f in frames[:2]) == data
    assert frames[2] == bytes((_wire.CLOSE_CHANNEL, _wire.STDIN_CHANNEL))


async def test_under_v4_stdin_ends_by_closing_the_connection() -> None:
    ws = FakeWs([binary(1, b"x", "after-stdin"), status(0)], protocol="v4.channel.k8s.io")
    await collect(ws, stdin="hi")
    assert ws.sent == [b"\x00hi"]
    assert ws.closed


@pytest.mark.parametrize(
    "source",
    [
        lambda: io.BytesIO(b"abc" * 100_000),
        lambda: iter([b"abc" * 50_000, b"abc" * 50_000]),
    ],
    ids=["file", "iterable"],
)
async def test_stdin_from_a_file_or_an_iterable(source: Any) -> None:
    ws = FakeWs([binary(1, b"x", "after-stdin"), status(0)])
    await collect(ws, stdin=source())
    body = b"".join(f[1:] for f in ws.sent if f[0] == _wire.STDIN_CHANNEL)
    assert body == b"abc" * 100_000
    assert max(len(f) for f in ws.sent) <= 1 + _wire.STDIN_FRAME


async def test_async_iterable_stdin() -> None:
    async def chunks() -> Any:
        yield b"a"
        yield b"b"

    ws = FakeWs([binary(1, b"x", "after-stdin"), status(0)])
    await collect(ws, stdin=chunks())
    assert ws.sent == [b"\x00a", b"\x00b", bytes((255, 0))]


async def test_output_past_the_cap_is_dropped_and_flagged() -> None:
    ws = FakeWs([binary(1, b"a" * 10), binary(2, b"b" * 3), status(0)])
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

    ws = Slow([status(137)])
    r = await collect(ws, timeout=0.05)
    assert r.timed_out and r.exit_code == 137 and r.signal == 9


async def test_streamed_events_end_with_one_exit() -> None:
    ws = FakeWs([binary(1, b"a"), binary(2, b"b"), status(3)])
    events = [ev async for ev in ExecStream(_events(ws, None, None))]  # type: ignore[arg-type]
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
