"""A workspace's size limit through the SDK (issue 47): a directory upload that would pass it
raises :class:`agentbox.UploadTooLargeError` before anything is extracted, naming the sizes
and the limit; nothing of it and no spool is left, and an upload that fits goes through. The
sandbox's workspace is on hack/cluster's btrfs quota root, so the limit is hard there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import agentbox

from .conftest import BASE_IMAGE, Env

QUOTA_ROOT = "/var/lib/agentbox/quota-workspaces"
#: The uploads' own check is under test, not the sidecar's measurements.
OPERATOR_ARGS = ("--node-root", QUOTA_ROOT, "--workspace-usage-interval-seconds", "600")
MIB = 1 << 20


def tree(root: Path, mib: int) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "first.txt").write_text("first")
    (root / "sub" / "blob").write_bytes(b"\7" * (mib * MIB))
    return root


def quota_root_fstype() -> str:
    """The filesystem type mounted at :data:`QUOTA_ROOT` (empty: none)."""
    return subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "--mountpoint", QUOTA_ROOT],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


async def test_an_upload_that_would_pass_the_limit_fails_whole(env: Env, tmp_dir: Path) -> None:
    assert quota_root_fstype() == "btrfs", (
        f"{QUOTA_ROOT} is not the quota root: run `hack/cluster quota-root`"
    )
    sbx = await env.sandboxes.get_or_create(
        agentbox.Scope.for_user("py-quota", "upload"),
        agentbox.SandboxSpec(
            image=BASE_IMAGE,
            image_pull_policy="Never",
            workspace=agentbox.WorkspaceSpec(size_limit="64Mi"),
            snapshot=agentbox.SnapshotPolicy(restore="None"),
        ),
    )
    try:
        await sbx.wait_ready(180)
    except agentbox.SandboxNotReadyError as err:
        pytest.fail(f"{err}\n{env.logs()}")

    async def left() -> str:
        """The destination's entries, then ``/``, then the upload spools left."""
        r = await sbx.exec("echo $(ls -A dst)/$(ls -A .agentbox/tmp | grep upload-)")
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode().strip()

    # ~40 MiB: its spool fits the 64 MiB, the spool and its files do not.
    with pytest.raises(agentbox.UploadTooLargeError) as e:
        await sbx.upload_dir(tree(tmp_dir / "forty", 40), "dst")
    assert isinstance(e.value, agentbox.RemoteError)
    assert f"size limit of {64 * MIB} bytes" in str(e.value), e.value
    assert "nothing was extracted" in e.value.stderr
    assert agentbox.kind_of(e.value) == "UploadTooLarge"
    assert await left() == "/"
    # ~80 MiB: its spool alone meets the hard limit, which the error names.
    with pytest.raises(agentbox.UploadSpoolError) as s:
        await sbx.upload_dir(tree(tmp_dir / "eighty", 80), "dst")
    assert f"its size limit is {64 * MIB} bytes" in s.value.stderr, s.value
    assert await left() == "/"
    # One that fits goes through.
    await sbx.upload_dir(tree(tmp_dir / "eight", 8), "dst")
    r = await sbx.exec("wc -c < dst/sub/blob; cat dst/first.txt")
    assert r.stdout.decode().split() == [str(8 * MIB), "first"], r
    assert await left() == "first.txt sub/"
