"""Workspace files from Python: read/write (bytes, text, streams, modes), ls/stat/exists,
rm/mkdir, directory upload/download, and confinement to the workspace (also through
symlinks, which only the pod can see)."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import pytest

import agentbox
from agentbox.exec import run
from agentbox.files import Workspace

from .conftest import BASE_IMAGE, Env


async def test_write_then_read_bytes_text_and_streams(ready: agentbox.Sandbox) -> None:
    await ready.write("notes/todo.txt", "ship it\n")
    assert await ready.read("notes/todo.txt") == b"ship it\n"
    assert await ready.read("/workspace/notes/todo.txt") == b"ship it\n"
    blob = os.urandom(3 << 20)
    await ready.write("big.bin", io.BytesIO(blob))
    assert await ready.read("big.bin") == blob

    async def chunks():  # type: ignore[no-untyped-def]
        yield b"a" * 10
        yield b"b" * 10

    await ready.write("streamed", chunks())
    assert await ready.read("streamed") == b"a" * 10 + b"b" * 10
    with pytest.raises(agentbox.FileTooLargeError):
        await ready.read("big.bin", max_bytes=1024)


async def test_modes_listing_and_stat(ready: agentbox.Sandbox) -> None:
    await ready.write("bin/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    assert (await ready.exec("./bin/run.sh")).stdout == b"run\n"
    st = await ready.stat("bin/run.sh")
    assert (st.name, st.kind, st.mode, st.size) == ("run.sh", "file", 0o755, 19)
    await ready.exec("ln -sf run.sh bin/link && mkdir -p bin/dir")
    entries = {e.name: e for e in await ready.ls("bin")}
    assert {n: e.kind for n, e in entries.items()} == {
        "dir": "dir",
        "link": "symlink",
        "run.sh": "file",
    }
    assert await ready.exists("bin/link") and not await ready.exists("bin/nope")


async def test_missing_files_raise_file_not_found(ready: agentbox.Sandbox) -> None:
    with pytest.raises(agentbox.RemoteFileNotFoundError) as e:
        await ready.read("does/not/exist")
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(agentbox.RemoteFileNotFoundError):
        await ready.ls("does-not-exist")
    await ready.mkdir("adir")
    with pytest.raises(agentbox.RemoteFileNotFoundError):
        await ready.read("adir")  # a directory is not a file


async def test_rm_and_mkdir(ready: agentbox.Sandbox) -> None:
    await ready.mkdir("t/a/b")
    await ready.write("t/a/b/f", b"x")
    with pytest.raises(agentbox.RemoteError):
        await ready.rm("t/a")  # not empty
    await ready.rm("t/a/b/f")
    assert not await ready.exists("t/a/b/f")
    await ready.rm("t", recursive=True)
    assert not await ready.exists("t")
    with pytest.raises(agentbox.RemoteError):
        await ready.rm("", recursive=True)  # never the workspace root
    with pytest.raises(agentbox.RemoteError):
        await ready.mkdir("x/y", parents=False)


async def test_a_symlink_out_of_the_workspace_is_refused_in_the_pod(
    ready: agentbox.Sandbox,
) -> None:
    await ready.exec("ln -sfn /etc escape")
    with pytest.raises(agentbox.PathError) as e:
        await ready.read("escape/hostname")
    assert e.value.reason == "Escapes"
    with pytest.raises(agentbox.PathError):
        await ready.write("escape/owned", b"x")
    assert (await ready.exec("test -e /etc/owned")).exit_code == 1


async def test_an_upload_into_a_tree_with_a_symlink_leading_out_is_refused_not_hung(
    ready: agentbox.Sandbox, tmp_dir: Path
) -> None:
    """The upload script's symlink check refuses the destination after reading the stream
    whole: with 8 MiB unread, the exec was left waiting for ever."""
    await ready.exec("mkdir -p esc && ln -sfn /etc esc/out")
    for i in range(8):
        (tmp_dir / f"d{i}").mkdir()
        (tmp_dir / f"d{i}" / "blob").write_bytes(bytes([i]) * (1 << 20))
    with pytest.raises(agentbox.PathError) as e:
        await asyncio.wait_for(ready.upload_dir(tmp_dir, "esc"), 60)
    assert e.value.reason == "Escapes"
    assert (await ready.exec("test -e /etc/d0")).exit_code == 1


async def test_directories_go_up_and_down_as_tar(ready: agentbox.Sandbox, tmp_dir: Path) -> None:
    src = tmp_dir / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "data.bin").write_bytes(os.urandom(200_000))
    (src / "link").symlink_to("pkg/mod.py")
    await ready.upload_dir(src, "proj")
    assert (
        await ready.exec("cat proj/pkg/mod.py; readlink proj/link")
    ).stdout == b"print('hi')\npkg/mod.py\n"
    # It went through a spool in the state directory, removed once extracted.
    assert (await ready.exec("ls -A .agentbox/tmp")).stdout == b""
    dst = tmp_dir / "dst"
    await ready.download_dir("proj", dst)
    assert (dst / "data.bin").read_bytes() == (src / "data.bin").read_bytes()
    assert (dst / "pkg" / "mod.py").read_text() == "print('hi')\n"
    assert os.readlink(dst / "link") == "pkg/mod.py"
    with pytest.raises(agentbox.RemoteFileNotFoundError):
        await ready.download_dir("no-such-dir", dst)


async def test_an_upload_to_a_full_disk_raises_upload_spool_error(env: Env, tmp_dir: Path) -> None:
    """A workspace whose disk cannot take the archive (a 1 MiB memory-backed emptyDir: a real
    ENOSPC): the spool fails, nothing is extracted, no spool is left, and the disk is free again
    for an upload that fits."""
    pods = f"/api/v1/namespaces/{env.ns}/pods"
    await env.kube.call(
        "POST",
        pods,
        body={
            "metadata": {"name": "small"},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "sandbox",
                        "image": BASE_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done",
                        ],
                        "volumeMounts": [{"name": "small", "mountPath": "/small"}],
                    }
                ],
                "volumes": [
                    {"name": "small", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
                ],
            },
        },
    )
    try:
        for _ in range(600):
            pod = await env.kube.call("GET", f"{pods}/small")
            if (pod.get("status") or {}).get("phase") == "Running":
                break
            await asyncio.sleep(0.2)
        ws = Workspace(env.kube, env.ns, "small", "/small")
        big = tmp_dir / "big"
        (big / "d").mkdir(parents=True)
        (big / "a.txt").write_text("first")
        (big / "d" / "blob").write_bytes(b"\7" * (2 << 20))
        with pytest.raises(agentbox.UploadSpoolError) as e:
            await ws.upload_dir(big, "dst")
        assert isinstance(e.value, agentbox.RemoteError)
        assert "No space left on device" in e.value.stderr and "disk full" in str(e.value)
        left = await run(env.kube, env.ns, "small", "ls -A /small/dst; ls -A /small/.agentbox/tmp")
        assert left.exit_code == 0, left.stderr
        assert left.stdout == b""
        fits = tmp_dir / "fits"
        fits.mkdir()
        (fits / "small.bin").write_bytes(b"\1" * (100 << 10))
        await ws.upload_dir(fits, "dst")
        assert await ws.read("dst/small.bin") == b"\1" * (100 << 10)
    finally:
        await env.kube.call("DELETE", f"{pods}/small")
