"""Lossless exec against a real sandbox (issue 28): a reader slower than the command gets every
byte or an error, never a short result; a stream cut before its trailer raises
:class:`agentbox.OutputCutError`.

Sizes: ``LOSSLESS_MB`` MiB per read (default 8), ``LOSSLESS_N`` reads (default 20), read at
``LOSSLESS_MBPS`` MiB/s (default 4); the issue's measurement is ``LOSSLESS_MB=50``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest

import agentbox
from agentbox import Exit, Output

MB = int(os.environ.get("LOSSLESS_MB", "8"))
N = int(os.environ.get("LOSSLESS_N", "20"))
RATE = int(os.environ.get("LOSSLESS_MBPS", "4")) << 20


async def big_file(sbx: agentbox.Sandbox) -> str:
    """Makes ``/workspace/big`` of ``MB`` MiB of random bytes; its SHA-256 as the pod says."""
    r = await sbx.exec(f"head -c {MB << 20} /dev/urandom > big && sha256sum big", check=True)
    return r.stdout.split()[0].decode()


async def read_slowly(sbx: agentbox.Sandbox) -> tuple[int, str, int | None]:
    """``cat big`` read at ``RATE`` bytes/s: length and SHA-256 of stdout, and exit code."""
    h = hashlib.sha256()
    n = 0
    code: int | None = None
    start = time.monotonic()
    async with await sbx.exec_stream(["cat", "big"]) as s:
        async for ev in s:
            if isinstance(ev, Output) and ev.stream == "stdout":
                h.update(ev.data)
                n += len(ev.data)
                due = n / RATE - (time.monotonic() - start)
                if due > 0:
                    await asyncio.sleep(due)
            elif isinstance(ev, Exit):
                code = ev.exit_code
    return n, h.hexdigest(), code


async def test_a_slow_reader_gets_every_byte_or_an_error(ready: agentbox.Sandbox) -> None:
    want = await big_file(ready)
    whole = short = 0
    errors: list[str] = []
    started = time.monotonic()
    for _ in range(N):
        try:
            n, got, code = await read_slowly(ready)
        except agentbox.OutputCutError as e:
            errors.append(str(e))
            continue
        if (n, got, code) == (MB << 20, want, 0):
            whole += 1
        else:
            short += 1
    took = time.monotonic() - started
    print(
        f"slow reader, {N} x {MB} MiB at {RATE >> 20} MiB/s through exec_stream: "
        f"{whole} whole, {short} short, {len(errors)} errors, {took:.1f} s {errors}"
    )
    assert short == 0
    assert whole == N


async def test_file_reads_are_whole(ready: agentbox.Sandbox) -> None:
    want = await big_file(ready)
    for _ in range(5):
        data = await ready.read("big", max_bytes=(MB << 20) + 1)
        assert len(data) == MB << 20
        assert hashlib.sha256(data).hexdigest() == want


async def test_a_stream_cut_before_its_trailer_raises(ready: agentbox.Sandbox) -> None:
    # The command kills the wrapper shell (its parent) before the wrapper printed its trailer.
    cut = "echo partial; kill -KILL $PPID; sleep 1"
    with pytest.raises(agentbox.OutputCutError) as e:
        await ready.exec(cut)
    assert (e.value.stream, e.value.received) == ("stdout", 8)
    assert isinstance(e.value, agentbox.ExecError)
    # Streamed: the output that arrived, then the error.
    got = b""
    with pytest.raises(agentbox.OutputCutError):
        async with await ready.exec_stream(cut) as s:
            async for ev in s:
                if isinstance(ev, Output):
                    got += ev.data
    assert got == b"partial\n"
    # Control: the same command without the kill is whole.
    assert (await ready.exec("echo partial; sleep 1")).stdout == b"partial\n"
