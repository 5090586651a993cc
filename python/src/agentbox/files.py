"""File access in a sandbox's workspace, over exec, confined to the workspace root twice:
here, before any request (:func:`confine` refuses ``..`` and absolute paths outside the root),
and in the pod, where the nearest existing ancestor of the path is resolved with
``readlink -f`` and must still lie under the resolved root, so a symlink cannot lead out.

The in-pod scripts are the Rust crate's, byte for byte: ``_scripts.py`` is generated from
``agentbox_api::remote`` (``cargo run --bin clientgen``) and checked there for drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from . import exec as _exec
from ._kube import Kube
from ._scripts import DOWNLOAD as DOWNLOAD
from ._scripts import LIST as LIST
from ._scripts import MKDIR as MKDIR
from ._scripts import PROLOGUE as PROLOGUE
from ._scripts import READ as READ
from ._scripts import RM as RM
from ._scripts import STAT as STAT
from ._scripts import UPLOAD as UPLOAD
from ._scripts import WRITE as WRITE
from ._scripts import WRITE_MODE as WRITE_MODE
from .errors import (
    FileTooLargeError,
    InvalidRequestError,
    PathError,
    ProtocolError,
    RemoteError,
    RemoteFileNotFoundError,
    UploadSpoolError,
    UploadTooLargeError,
)
from .exec import ExecResult, Output, StdinSource

__all__ = ["DirEntry", "confine"]

#: Exit code of the in-pod scripts for "resolves outside the workspace".
ESCAPES = 97
#: Exit code of the in-pod scripts for "missing or of the wrong type".
MISSING = 96
#: Exit code of the upload script for "the archive could not be written to its spool" (a
#: full disk, most often): nothing was extracted and no spool is left.
SPOOL_FAILED = 95
#: Exit code of the upload script for "extracting the archive would pass the workspace's size
#: limit" (stderr names the sizes and the limit): nothing was extracted and no spool is left.
TOO_LARGE = 94
#: Largest file :meth:`agentbox.Sandbox.read` returns by default.
READ_CAP = 64 << 20
#: argv[0] of the file scripts.
ARGV0 = "agentbox-files"


def confine(root: str, path: str) -> str:
    """Maps ``path`` (relative to ``root``, or absolute under it) to an absolute, normalised
    path under ``root``; refuses ``..`` anywhere and absolute paths outside the root with
    :class:`~agentbox.errors.PathError`. ``""`` and ``"."`` are the root. Pure: symlinks are
    checked in the pod.
    """
    if not isinstance(path, str):
        raise PathError(str(path), "Invalid", f"invalid path {path!r}: not a string")
    if "\0" in path or not root.startswith("/"):
        raise PathError(path, "Invalid", f"invalid path {path!r}")
    root_parts = [c for c in root.split("/") if c not in ("", ".")]
    if ".." in root_parts:
        raise PathError(root, "Invalid", f"invalid path {root!r}")
    parts = [c for c in path.split("/") if c not in ("", ".")]
    if ".." in parts:
        raise PathError(path, "DotDot", f"path {path!r} contains '..'")
    if path.startswith("/"):
        if parts[: len(root_parts)] != root_parts:
            raise PathError(
                path, "OutsideRoot", f"path {path!r} is outside the workspace root {root!r}"
            )
        rel = parts[len(root_parts) :]
    else:
        rel = parts
    return "/" + "/".join(root_parts + rel)


def file_argv(script: str, root: str, path: str, *extra: str) -> tuple[list[str], str]:
    """The argv that runs a file script on ``path`` in the pod, and the confined path."""
    p = confine(root, path)
    return ["sh", "-c", PROLOGUE + script, ARGV0, root, p, *extra], p


@dataclass(frozen=True)
class DirEntry:
    """One entry of a workspace directory (symlinks are not followed)."""

    #: File name (no directory part).
    name: str
    #: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"`` (device, FIFO, socket).
    kind: Literal["file", "dir", "symlink", "other"]
    #: Size in bytes.
    size: int
    #: Permission bits (e.g. ``0o644``).
    mode: int
    #: Modification time, seconds since the epoch.
    mtime: int


_KINDS: dict[int, Literal["file", "dir", "symlink"]] = {
    0o100000: "file",
    0o040000: "dir",
    0o120000: "symlink",
}


def parse_listing(raw: bytes) -> list[DirEntry]:
    """Parses the NUL-separated ``"<hex mode> <size> <mtime> <name>"`` records of the list
    script, sorted by name.
    """
    entries = []
    for rec in raw.split(b"\0"):
        if not rec:
            continue
        fields = rec.split(b" ", 3)
        if len(fields) != 4:
            raise ProtocolError(f"bad listing record {rec!r}")
        m, s, t, name = fields
        try:
            mode = int(m.decode("ascii"), 16)
            size = int(s.decode("ascii"))
            mtime = int(t.decode("ascii"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"bad listing record {rec!r}: {e}") from None
        if mode < 0 or size < 0:
            raise ProtocolError(f"bad listing record {rec!r}")
        entries.append(
            DirEntry(
                name.decode("utf-8", errors="replace"),
                _KINDS.get(mode & 0o170000, "other"),
                size,
                mode & 0o7777,
                mtime,
            )
        )
    entries.sort(key=lambda e: e.name.encode())
    return entries


def check(path: str, result: ExecResult) -> None:
    """Maps a file script's exit to an error."""
    msg = result.stderr_text().strip()
    if result.exit_code == 0:
        return
    if result.exit_code == ESCAPES:
        raise PathError(path, "Escapes", f"path {path!r} resolves outside the workspace (symlink)")
    if result.exit_code == MISSING:
        raise RemoteFileNotFoundError(msg)
    if result.exit_code == SPOOL_FAILED:
        raise UploadSpoolError(result.exit_code, msg)
    if result.exit_code == TOO_LARGE:
        raise UploadTooLargeError(result.exit_code, msg)
    raise RemoteError(result.exit_code, msg)


class Workspace:
    """File operations on the workspace at ``root`` of one pod (what the sandbox handle's
    file methods use).
    """

    def __init__(self, kube: Kube, namespace: str, pod: str, root: str) -> None:
        self._kube = kube
        self._ns = namespace
        self._pod = pod
        self.root = root

    async def _run(
        self, argv: Sequence[str], *, stdin: StdinSource | None = None, max_output: int = 64 << 10
    ) -> ExecResult:
        return await _exec.run(
            self._kube, self._ns, self._pod, argv, stdin=stdin, max_output=max_output
        )

    async def read(self, path: str, max_bytes: int = READ_CAP) -> bytes:
        """A file's content; :class:`FileTooLargeError` beyond ``max_bytes``."""
        argv, p = file_argv(READ, self.root, path)
        out = await self._run(argv, max_output=max_bytes)
        check(p, out)
        if out.stdout_truncated:
            raise FileTooLargeError(f"{p} is larger than {max_bytes} bytes")
        return out.stdout

    async def write(self, path: str, data: StdinSource, mode: int | None = None) -> None:
        """Writes a file atomically (temp file + rename), creating its parents."""
        if mode is None:
            argv, p = file_argv(WRITE, self.root, path)
        else:
            if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise InvalidRequestError(f"mode must be an int from 0 to 0o7777, not {mode!r}")
            argv, p = file_argv(WRITE_MODE, self.root, path, format(mode, "o"))
        check(p, await self._run(argv, stdin=data))

    async def ls(self, path: str = "") -> list[DirEntry]:
        """The entries of a directory, sorted by name."""
        argv, p = file_argv(LIST, self.root, path)
        out = await self._run(argv, max_output=64 << 20)
        check(p, out)
        return parse_listing(out.stdout)

    async def stat(self, path: str) -> DirEntry:
        """One entry (a symlink itself, not its target)."""
        argv, p = file_argv(STAT, self.root, path)
        out = await self._run(argv)
        check(p, out)
        entries = parse_listing(out.stdout)
        if len(entries) != 1:
            raise ProtocolError(f"stat {p}: {out.stdout!r}")
        return entries[0]

    async def exists(self, path: str) -> bool:
        """Whether the path exists (a dangling symlink does)."""
        try:
            await self.stat(path)
        except RemoteFileNotFoundError:
            return False
        return True

    async def rm(self, path: str, recursive: bool = False) -> None:
        """Removes a file, a symlink or an empty directory; with ``recursive``, a whole tree.
        The workspace root itself is never removed.
        """
        argv, p = file_argv(RM, self.root, path, "r" if recursive else "")
        check(p, await self._run(argv))

    async def mkdir(self, path: str, parents: bool = True) -> None:
        """Creates a directory (with its parents unless ``parents=False``)."""
        argv, p = file_argv(MKDIR, self.root, path, "p" if parents else "")
        check(p, await self._run(argv))

    async def upload_dir(self, local: str | os.PathLike[str], remote: str) -> None:
        """Copies the local directory ``local`` into the workspace directory ``remote``
        (created if missing; existing files overwritten) as a tar stream built on the fly, so
        memory stays flat. Symlinks are sent as symlinks, never followed. In the pod the stream
        is spooled to a file under the workspace's ``.agentbox`` state directory and extracted
        from there, so the workspace's disk needs room for the archive beside its files while
        the upload lasts; a spool that cannot be written (a full disk) raises
        :class:`UploadSpoolError`, and an upload that would pass the workspace's size limit
        :class:`UploadTooLargeError`, each with nothing extracted.
        """
        src = Path(local)
        if not src.is_dir():  # noqa: ASYNC240 (one stat, before anything starts)
            raise InvalidRequestError(f"{src} is not a directory")
        argv, p = file_argv(UPLOAD, self.root, remote)
        r, w = os.pipe()
        reader = os.fdopen(r, "rb")

        def build() -> None:
            with (
                os.fdopen(w, "wb") as out,
                tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
                tar.add(src, arcname=".", recursive=True)

        builder = asyncio.ensure_future(asyncio.to_thread(build))
        build_error: BaseException | None = None
        try:
            out = await self._run(argv, stdin=reader)
        finally:
            # Closing the read end makes a builder blocked on a full pipe fail and stop.
            reader.close()
            try:
                await builder
            except BrokenPipeError:
                pass
            except Exception as e:
                build_error = e
        check(p, out)
        if build_error is not None:
            raise build_error

    async def download_dir(self, remote: str, local: str | os.PathLike[str]) -> None:
        """Copies the workspace directory ``remote`` into the local directory ``local``
        (created if missing), streaming the tar archive; members that would land outside
        ``local`` (absolute paths, ``..``, links leaving it) are refused by the tar reader's
        ``data`` filter.
        """
        if not hasattr(tarfile, "data_filter"):
            raise InvalidRequestError("download_dir needs a Python with tarfile extraction filters")
        argv, p = file_argv(DOWNLOAD, self.root, remote)
        dst = Path(local)
        dst.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (one mkdir, before anything starts)
        r, w = os.pipe()
        writer: IO[bytes] = os.fdopen(w, "wb")

        def unpack() -> None:
            with os.fdopen(r, "rb") as inp:
                try:
                    with tarfile.open(fileobj=inp, mode="r|") as tar:
                        tar.extractall(dst, filter="data")
                finally:
                    # Drain what is left so the writer never blocks on a failed unpack.
                    while inp.read(1 << 16):
                        pass

        unpacker = asyncio.ensure_future(asyncio.to_thread(unpack))
        err = bytearray()
        exit_ev: _exec.Exit | None = None
        try:
            s = await _exec.stream(self._kube, self._ns, self._pod, argv)
            async with s:
                async for ev in s:
                    if isinstance(ev, Output):
                        if ev.stream == "stdout":
                            await asyncio.to_thread(writer.write, ev.data)
                        elif len(err) < 64 << 10:
                            err += ev.data
                    else:
                        exit_ev = ev
        finally:
            with contextlib.suppress(BrokenPipeError):
                writer.close()
            unpack_error: BaseException | None = None
            try:
                await unpacker
            except Exception as e:
                unpack_error = e
        if exit_ev is None:
            raise ProtocolError("download: no exit status")
        check(p, ExecResult(exit_ev.exit_code, b"", bytes(err)))
        if isinstance(unpack_error, tarfile.TarError):
            raise ProtocolError(f"refused the archive from {p}: {unpack_error}") from unpack_error
        if unpack_error is not None:
            raise unpack_error
