"""The scope's guard from Python against a Rust holder (the CLI's ``agentbox lock``) and the
operator: the same Lease, mutual exclusion both ways, monotonic fencing tokens, and a lost
lease cancelling the guarded block."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
from pathlib import Path

import pytest

import agentbox
from agentbox import labels
from agentbox.guard import Guard
from agentbox.snapshots import failing_condition

from .conftest import BASE_IMAGE, Env, binary

SPEC = agentbox.SandboxSpec(image=BASE_IMAGE, image_pull_policy="Never")


def lock_cmd(env: Env, sbx: agentbox.Sandbox, *args: str) -> list[str]:
    return [str(binary("agentbox", "AGENTBOX_CLI_BIN")), "-n", env.ns, "lock", sbx.name, *args]


async def run_cli(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def test_a_python_holder_keeps_the_rust_cli_out(env: Env, ready: agentbox.Sandbox) -> None:
    async with ready.guard(wait=30) as g:
        assert g.lease_name == labels.lease_name(labels.scope_key(ready.scope))
        code, out = await run_cli(*lock_cmd(env, ready, "--wait", "1", "--", "true"))
        assert code == 1, out
        assert "timed out waiting for lease" in out and g.holder in out
        lease = await env.kube.call(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases/{g.lease_name}"
        )
        assert lease["spec"]["holderIdentity"] == g.holder
        assert lease["metadata"]["labels"] == labels.scope_labels(ready.scope)
    # Released: the CLI gets it now, with a larger fencing token.
    code, out = await run_cli(
        *lock_cmd(env, ready, "--wait", "30", "--", "sh", "-c", 'echo "$AGENTBOX_FENCING_TOKEN"')
    )
    assert code == 0, out
    assert int(out.strip()) > g.fencing_token


async def test_a_rust_holder_keeps_python_out(
    env: Env, ready: agentbox.Sandbox, tmp_dir: Path
) -> None:
    token_file = tmp_dir / "token"
    errors = tmp_dir / "lock.stderr"
    proc = subprocess.Popen(  # noqa: ASYNC220 (started, not waited on, here)
        lock_cmd(
            env, ready, "--", "sh", "-c", f'echo "$AGENTBOX_FENCING_TOKEN" > {token_file}; sleep 5'
        ),
        stdout=subprocess.DEVNULL,
        stderr=errors.open("wb"),
    )
    try:
        for _ in range(300):
            if token_file.exists() and token_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        rust_token = int(token_file.read_text())
        with pytest.raises(agentbox.GuardTimeoutError) as e:
            async with ready.guard(wait=0.5):
                pytest.fail("acquired a guard the CLI holds")
        assert e.value.holder and isinstance(e.value, TimeoutError)
        # Waiting long enough, Python gets it once the CLI's command ends and it releases.
        async with ready.guard(wait=60) as g:
            # It released before it exited: wait for the exit, then for its status.
            code = await asyncio.to_thread(proc.wait, 30)
            assert code == 0, errors.read_text()
            assert g.fencing_token > rust_token
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


async def test_losing_the_lease_cancels_the_guarded_block(
    env: Env, ready: agentbox.Sandbox
) -> None:
    cfg = agentbox.GuardConfig(lease_duration=3)
    reached_the_end = False
    with pytest.raises(agentbox.GuardLostError) as e:
        async with ready.guard(wait=30, config=cfg) as g:
            # Someone takes the lease over behind our back (a conditioned write, as a
            # contender's takeover would be).
            path = f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases/{g.lease_name}"
            for _ in range(20):  # again when a renewal of ours came between read and write
                lease = await env.kube.call("GET", path)
                lease["spec"]["holderIdentity"] = "thief"
                try:
                    await env.kube.call("PUT", path, body=lease)
                    break
                except agentbox.ConflictError:
                    continue
            else:
                pytest.fail("the thief's write conflicted 20 times")
            await asyncio.sleep(60)  # cancelled at the next renewal (every second)
            reached_the_end = True
    assert not reached_the_end
    assert isinstance(e.value.__cause__, asyncio.CancelledError)
    assert g.is_lost
    # The thief's lease stays; our task was not left cancelled (later awaits work).
    await asyncio.sleep(0)
    lease = await env.kube.call("GET", path)
    assert lease["spec"]["holderIdentity"] == "thief"
    # Free it again for the other tests (a release by its owner).
    del lease["spec"]["holderIdentity"]
    await env.kube.call("PUT", path, body=lease)


async def test_the_operator_snapshots_only_when_the_guard_is_free(
    env: Env, ready: agentbox.Sandbox
) -> None:
    await ready.write("guarded.txt", "v1\n")
    async with ready.guard(wait=30) as g:
        snap = await ready.snapshot(wait=False)
        # Give the operator time to try: it must wait for the guard, not snapshot under us.
        await asyncio.sleep(3)
        seen = await env.sandboxes.get_snapshot(snap.name)
        assert seen.phase in ("", "Pending"), seen
    done = await env.sandboxes.wait_snapshot(snap.name, 120)
    assert done.phase == "Ready"
    assert done.fencing_token is not None and done.fencing_token > g.fencing_token


async def test_a_snapshot_and_a_suspension_handed_over_under_the_guard_leave_no_gap(
    env: Env,
) -> None:
    """A harness that holds its scope's guard has the operator snapshot and suspend under that
    hold: nobody can take the guard between its last command and the suspension, the snapshot
    captures that last command, and the hold is never released in between."""
    scope = agentbox.Scope.for_user("handoff", "alice")
    sbx = await env.sandboxes.get_or_create(scope, SPEC)
    await sbx.wait_ready(120)
    async with sbx.guard(wait=30) as g:
        await sbx.write("last.txt", "the run's last word\n")
        snap = await sbx.snapshot(guard=g, timeout=120)
        assert snap.phase == "Ready"
        # Taken under our hold, not a new acquisition of the operator's.
        assert snap.fencing_token == g.fencing_token
        await sbx.suspend(guard=g, timeout=120)
        assert sbx.phase == "Suspended"
        assert g.held
        lease = await env.kube.call(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases/{g.lease_name}"
        )
        assert lease["spec"]["holderIdentity"] == g.holder
        assert lease["spec"]["leaseTransitions"] == g.fencing_token
    restored = await env.sandboxes.create_restored(scope, SPEC, snap.name, name="handoff-heir")
    await restored.wait_ready(120)
    assert await restored.read("last.txt") == b"the run's last word\n"
    await restored.delete(wait=True)
    await sbx.delete(wait=True)


async def test_a_hold_that_is_not_held_is_refused_before_any_request(
    env: Env, ready: agentbox.Sandbox
) -> None:
    g = ready.guard(wait=30)
    with pytest.raises(agentbox.errors.GuardError, match="not held"):
        await ready.snapshot(guard=g)
    other = agentbox.Scope.for_user("handoff", "somebody-else")
    async with env.sandboxes.guard(other, wait=30) as og:
        with pytest.raises(agentbox.errors.ScopeMismatchError):
            await ready.suspend(guard=og)


async def test_a_snapshot_requested_and_a_suspension_under_a_held_guard_never_leave_it_pending(
    env: Env,
) -> None:
    """The sequence that left a snapshot Pending for good: hold the guard, ask for a snapshot
    and a suspension without handing the hold over, release. The operator suspends only under
    the guard (not under the holder), and a snapshot whose sandbox has no pod any more fails
    at once with its reason instead of waiting for one."""
    scope = agentbox.Scope.for_user("handoff", "bob")
    sbx = await env.sandboxes.get_or_create(scope, SPEC)
    await sbx.wait_ready(120)
    pod = sbx.pod_name
    async with sbx.guard(wait=30):
        await sbx.write("x.txt", "x\n")
        snap = await sbx.snapshot(wait=False)
        await sbx.suspend()
        # The operator does not stop the pod under the holder: its command still runs.
        await asyncio.sleep(3)
        r = await sbx.exec(["cat", "x.txt"])
        assert r.stdout == b"x\n"
    for _ in range(120):
        done = await env.sandboxes.get_snapshot(snap.name)
        if done.phase in ("Ready", "Failed"):
            break
        await asyncio.sleep(1)
    assert done.phase in ("Ready", "Failed"), done
    if done.phase == "Failed":
        assert failing_condition(done.raw)[0] == "SandboxStopped", done
    await sbx.suspend(wait=True, timeout=120)
    pods = await env.kube.call("GET", f"/api/v1/namespaces/{env.ns}/pods")
    # Gone, or going: Suspended is written as the pod is asked to stop.
    left = [p for p in pods["items"] if p["metadata"]["name"] == pod]
    assert all(p["metadata"].get("deletionTimestamp") for p in left), left
    await sbx.delete(wait=True)


async def test_two_harnesses_back_to_back_take_turns(env: Env) -> None:
    """Issue 42, finding 3: two harnesses take one guard back to back, 20 turns each (take it,
    read a counter from a ConfigMap, write it back incremented with an unconditioned update,
    release, want it again at once). Before the queue slot the releaser took it again ahead of
    the waiter's next poll: 1-3 hand-overs in 40 turns; with a 100 ms yield, a hand-over was lost
    whenever the waiter reacted more slowly than that. The issue's figures: at least 35
    hand-overs of 40, no wait longer than two turns, and the exact count. A waiter waits for one
    turn of the other's (the hand-over to it and its hold) and its own hand-over, so "one turn"
    is the longest hold plus the longest hand-over of the run: on a loaded machine either
    stretches tenfold now and then, and a wait behind that is no unfairness. A wait through a
    yield or a missed wake-up (1-2 s) exceeds two turns; an overtaken waiter fails the count."""
    cms = f"/api/v1/namespaces/{env.ns}/configmaps"
    await env.kube.call("POST", cms, body={"metadata": {"name": "counter"}, "data": {"n": "0"}})
    loop = asyncio.get_running_loop()
    # token, who, waited, held, first, took
    turns: list[tuple[int, str, float, float, bool, float]] = []
    # Both harnesses start asking at once, connected: a harness still opening its first
    # connection does not want the guard yet, and the other's turns meanwhile are not unfair.
    # (asyncio.Barrier is 3.11's; the package supports 3.10.)
    connected: list[str] = []
    start = asyncio.Event()

    async def harness(who: str) -> None:
        # The defaults a harness gets; no scope labels (the operator's sweep leaves it alone).
        cfg = agentbox.GuardConfig(holder=f"harness-{who}")
        await env.kube.call("GET", f"{cms}/counter")
        connected.append(who)
        if len(connected) == 2:
            start.set()
        await start.wait()
        for i in range(20):
            asked = loop.time()
            g = Guard(env.sandboxes.kube, env.ns, "fair", {}, cfg, wait=60)
            await g.acquire()
            took = loop.time()
            cm = await env.kube.call("GET", f"{cms}/counter")
            n = int(cm["data"]["n"])
            # Unconditioned: only the guard keeps the count exact.
            await env.kube.call(
                "PATCH",
                f"{cms}/counter",
                body={"data": {"n": str(n + 1)}},
                content_type="application/merge-patch+json",
            )
            await g.release()
            turns.append((g.fencing_token, who, took - asked, loop.time() - took, i == 0, took))

    await asyncio.gather(harness("a"), harness("b"))
    turns.sort()
    hand_overs = sum(1 for x, y in itertools.pairwise(turns) if x[1] != y[1])
    count = (await env.kube.call("GET", f"{cms}/counter"))["data"]["n"]
    held = sorted(t[3] for t in turns)
    # The pace: the median time from one acquisition to the next (a hold and a hand-over).
    gaps = sorted(y[5] - x[5] for x, y in itertools.pairwise(turns))
    pace = gaps[len(gaps) // 2]
    handoff = sorted(y[5] - (x[5] + x[3]) for x, y in itertools.pairwise(turns) if x[1] != y[1])
    longest = max(t[2] for t in turns)
    turn = held[-1] + (handoff[-1] if handoff else 0.0)
    ratio = longest / turn
    print(
        f"guard fairness (python): {hand_overs} hand-overs in {len(turns)} turns; longest wait "
        f"{longest * 1000:.1f} ms ("
        f"{max(t[2] for t in turns if not t[4]) * 1000:.1f} ms after each harness's first turn)"
        f" = {ratio:.2f} turns of {turn * 1000:.1f} ms; hold p50 {held[len(held) // 2] * 1000:.1f}"
        f" ms, max {held[-1] * 1000:.1f} ms; one acquisition to the next p50 {pace * 1000:.1f} ms;"
        f" hand-over p50"
        f" {handoff[len(handoff) // 2] * 1000 if handoff else 0:.1f} ms,"
        f" max {handoff[-1] * 1000 if handoff else 0:.1f} ms; counter {count};"
        f" order {''.join(t[1] for t in turns)}"
    )
    assert count == "40", "a lost update"
    # An unfair guard gave 1-3 hand-overs; 39 is every one there can be.
    assert hand_overs >= 35, f"only {hand_overs} hand-overs in 40 turns"
    assert ratio <= 2, f"a wait of {ratio:.2f} turns: someone was overtaken or the guard stood free"
