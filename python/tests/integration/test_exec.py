"""Exec against a real sandbox: exit codes, stdin, timeouts, output caps, streaming, sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import agentbox
from agentbox import Exit, Output


async def test_exit_codes_are_real(ready: agentbox.Sandbox) -> None:
    r = await ready.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not r.ok
    assert (await ready.exec(["true"])).ok
    killed = await ready.exec("kill -9 $$")
    assert killed.exit_code == 137 and killed.signal == 9


async def test_commands_run_in_the_workspace_with_env_and_cwd(ready: agentbox.Sandbox) -> None:
    assert (await ready.exec("pwd")).stdout == b"/workspace\n"
    await ready.exec("mkdir -p sub")
    r = await ready.exec(
        ["sh", "-c", 'pwd; echo "$A|$B"'], cwd="/workspace/sub", env={"A": "x y", "B": "it's"}
    )
    assert r.stdout == b"/workspace/sub\nx y|it's\n"


async def test_a_missing_program_exits_127(
    ready: agentbox.Sandbox, sandboxes: agentbox.Sandboxes
) -> None:
    # Every command runs under the wrapper, whose shell reports 127 and its message, with or
    # without a cwd.
    assert (await ready.exec(["no-such-program"])).exit_code == 127
    kube = await sandboxes.kube()
    r = await agentbox.exec.run(kube, ready.namespace, ready.pod_name, ["no-such-program"])
    assert r.exit_code == 127 and b"no-such-program" in r.stderr


async def test_check_raises_with_the_result(ready: agentbox.Sandbox) -> None:
    with pytest.raises(agentbox.CommandError) as e:
        await ready.exec("echo nope >&2; exit 5", check=True)
    assert e.value.result.exit_code == 5 and e.value.result.stderr == b"nope\n"


async def test_stdin_is_delivered_and_closed(ready: agentbox.Sandbox) -> None:
    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and some: several frames
    r = await ready.exec("cat > /tmp/in; sha256sum < /tmp/in; wc -c < /tmp/in", stdin=data)
    import hashlib

    assert hashlib.sha256(data).hexdigest().encode() in r.stdout
    assert r.stdout.split()[-1] == str(len(data)).encode()
    assert (await ready.exec(["cat"], stdin="text in")).stdout == b"text in"


async def test_a_timeout_kills_the_command_and_raises(ready: agentbox.Sandbox) -> None:
    with pytest.raises(agentbox.ExecTimeoutError) as e:
        await ready.exec("echo started; sleep 30; echo never", timeout=1)
    assert isinstance(e.value, TimeoutError)
    res = e.value.result
    assert res is not None and res.timed_out and res.stdout == b"started\n"
    assert res.exit_code == 137
    # The whole process group is gone: no `sleep 30` left behind.
    ps = await ready.exec("ps -o args | grep -c '^sleep 30' || true")
    assert ps.stdout.strip() == b"0"


async def test_large_output_is_capped_and_flagged(ready: agentbox.Sandbox) -> None:
    r = await ready.exec("head -c 3000000 /dev/zero; head -c 10 /dev/zero >&2", max_output=1 << 20)
    assert len(r.stdout) == 1 << 20 and r.stdout_truncated
    assert len(r.stderr) == 10 and not r.stderr_truncated
    assert r.ok


async def test_streaming_yields_chunks_then_exit(ready: agentbox.Sandbox) -> None:
    async with await ready.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done; exit 4") as s:
        events = [ev async for ev in s]
    out = b"".join(ev.data for ev in events if isinstance(ev, Output))
    assert out == b"1\n2\n3\n"
    assert events[-1] == Exit(4, False, "")
    assert sum(isinstance(ev, Exit) for ev in events) == 1


async def _live(ready: agentbox.Sandbox, pattern: str) -> list[str]:
    """The pod's ``sleep`` processes whose arguments match ``pattern``."""
    r = await ready.exec(["sh", "-c", 'ps -o args | grep -E "^sleep $1" || true', "ps", pattern])
    return r.stdout.decode().splitlines()


async def test_kill_ends_a_streamed_command_and_its_children_in_the_pod(
    ready: agentbox.Sandbox,
) -> None:
    # A stdio server that ignores the end of its input, with a child in its own session.
    async def forever() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    s = await ready.exec_stream(
        "trap '' HUP TERM; sleep 4124 & setsid sleep 4125 & echo up; sleep 4126",
        stdin=forever(),
    )
    assert s.process_id
    it = s.__aiter__()
    assert await it.__anext__() == Output("stdout", b"up\n")
    assert len(await _live(ready, "412[456]")) == 3
    await s.kill()
    events = [ev async for ev in it]
    assert events[-1] == Exit(137, False, "")
    await s.aclose()
    assert await _live(ready, "412[456]") == []


async def test_a_persistent_session_runs_commands_with_their_own_codes(
    ready: agentbox.Sandbox,
) -> None:
    async with ready.session() as s:
        a = await s.run("echo one; exit 2")
        b = await s.run(["sh", "-c", "pwd; echo err >&2"])
        assert (a.exit_code, a.stdout) == (2, b"one\n")
        assert (b.exit_code, b.stdout, b.stderr) == (0, b"/workspace\n", b"err\n")
        # `exit` in one command does not end the session; state does not carry over.
        await s.run("cd /tmp; exit 0")
        assert (await s.run("pwd")).stdout == b"/workspace\n"
        with pytest.raises(agentbox.ExecTimeoutError):
            await s.run("sleep 20", timeout=0.5)
        r = await s.run("head -c 100000 /dev/zero", max_output=10)
        assert r.stdout == b"\0" * 10 and r.stdout_truncated
        # The shell dies while a command runs: that command fails, the next gets a new shell.
        with pytest.raises(agentbox.SessionError):
            await s.run("kill -9 $PPID")
        assert (await s.run("echo back")).stdout == b"back\n"
    # A session in a directory that does not exist fails its command, naming it.
    async with ready.session(cwd="/no/such/dir") as lost:
        with pytest.raises(agentbox.SessionError, match="/no/such/dir"):
            await lost.run("true")


async def test_concurrent_execs(ready: agentbox.Sandbox) -> None:
    rs = await asyncio.gather(*(ready.exec(["sh", "-c", f"echo {i}"]) for i in range(8)))
    assert [r.stdout for r in rs] == [f"{i}\n".encode() for i in range(8)]
