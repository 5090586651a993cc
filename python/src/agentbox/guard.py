"""The execution guard: one ``coordination.k8s.io/v1`` Lease per scope key, the same protocol as
the Rust crate's ``agentbox_api::guard`` (checked against its vectors), so Python holders, Rust
holders (``agentbox lock``, Rust harnesses) and the operator's snapshots and restores exclude
each other on one scope.

- **Acquire** waits up to a deadline: create the Lease, or take over a free or expired one
  with an update conditioned on its ``resourceVersion``; a 409 means someone else won.
- **Fencing token**: every acquisition bumps ``leaseTransitions``;
  :attr:`Guard.fencing_token` is it.
- **Renew** in the background every ``duration / 3`` with conditioned updates. A 409 or 404,
  or no successful renewal for long enough that another party could take over, means the
  guard is **lost**: the guarded block is cancelled and :class:`~agentbox.errors.GuardLostError`
  raised from it. If the API server cannot be reached the guard fails closed.
- **Release** clears the holder with a conditioned update but keeps the Lease (and its
  ``leaseTransitions``), so fencing tokens stay monotonic.

Expiry is judged two ways, either sufficing: the holder's ``renewTime`` plus its duration plus
a clock-skew allowance is past, or this contender has seen the same holder and ``renewTime``
for a whole lease duration on its own monotonic clock.

**Fair hand-off**: a contender that finds the lease held queues in a one-place slot on the
Lease (annotations :data:`NEXT_ANNOTATION`, :data:`NEXT_RENEW_ANNOTATION`) and refreshes its
claim while it waits; a free lease goes to the slot's owner while its claim is fresh. A release
keeps the slot, so the releaser cannot take the guard again ahead of the contender queued
behind it. Waiters learn of a release from a watch on the one Lease (a slow poll is the
fallback). The slot is written only behind holders that expect it
(:data:`FAIR_HOLDER_ANNOTATION`): they re-read on a 409 and renew again if the Lease is still
theirs. A client unaware of the slot still excludes everyone; it only ignores the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import random
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ._kube import Kube, KubeSource, leases_path
from .errors import (
    AgentboxError,
    ApiError,
    ConflictError,
    GuardLostError,
    GuardTimeoutError,
    NotFoundError,
    TransportError,
)

__all__ = ["Guard", "GuardConfig", "holder_identity"]

#: Annotation on a guard Lease: the holder identity of the contender queued next.
NEXT_ANNOTATION = "agentbox.dev/guard-next"
#: Annotation on a guard Lease: when the queued contender last claimed or refreshed its place.
NEXT_RENEW_ANNOTATION = "agentbox.dev/guard-next-renew"
#: Annotation on a guard Lease: the holder that took it knowing the queue slot; contenders
#: write the slot only while the Lease's holder is the one named here.
FAIR_HOLDER_ANNOTATION = "agentbox.dev/guard-fair-holder"
#: The longest a waiting contender goes without reading the Lease again while it watches it
#: (a third of the lease duration when that is shorter).
WATCH_FALLBACK = 2.0
#: The longest a holder whose hold was shared (its acquisition waited for another party, or it
#: created the Lease or took it from another holder) leaves a free Lease without a claim to
#: others after releasing it: the one that waited meanwhile may not have claimed the queue slot
#: yet (its claim races a short turn), and the releaser, wanting the guard again at once, would
#: take it first. The yield ends as soon as the Lease shows another party acting (a take or a
#: claim), so the bound only matters when nobody else wants the guard any more.
YIELD = 1.0

#: When each holder of this process last released a Lease after a shared hold (monotonic).
_RELEASED: dict[tuple[str, str], float] = {}


def _yield_left(path: str, holder: str) -> float:
    at = _RELEASED.get((path, holder))
    return 0.0 if at is None else max(0.0, YIELD - (asyncio.get_running_loop().time() - at))


_I32_MAX = 2**31 - 1


def holder_identity() -> str:
    """A holder identity, ``hostname/pid/random``, unique per guard user (as Rust's)."""
    host = os.environ.get("HOSTNAME") or ""
    if not host:
        try:
            with open("/etc/hostname", encoding="utf-8") as f:
                host = f.read().strip()
        except OSError:
            host = ""
    host = host or socket.gethostname() or "unknown"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass
class GuardConfig:
    """Settings of a guard (seconds)."""

    #: How long the lease stays valid without renewal (whole seconds on the Lease, at least 1).
    lease_duration: float = 15.0
    #: Renewal period; ``None`` means a third of the lease duration.
    renew_interval: float | None = None
    #: Polling period while waiting for a held lease (jittered ±50%).
    retry_interval: float = 0.2
    #: Allowance for clock differences when judging expiry from ``renewTime``.
    clock_skew: float = 2.0
    #: Identity written to ``holderIdentity``.
    holder: str = field(default_factory=holder_identity)

    @property
    def duration_secs(self) -> int:
        """``leaseDurationSeconds``: whole seconds, at least 1."""
        return max(int(self.lease_duration), 1)

    @property
    def renew_every(self) -> float:
        """The renewal period."""
        if self.renew_interval is not None:
            return self.renew_interval
        return self.duration_secs / 3

    @property
    def trust_window(self) -> float:
        """How long after the start of the last successful renewal the lease is still trusted:
        the duration less a margin, since others may take over right at the duration.
        """
        d = float(self.duration_secs)
        margin = min(max(d / 5, 0.5), d / 2)
        return d - margin


_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})")


def parse_time(s: str) -> _dt.datetime:
    """Parses a Kubernetes ``Time``/``MicroTime`` (RFC 3339, any fraction digits)."""
    m = _TIME.fullmatch(s.strip())
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    base, frac, tz = m.groups()
    micros = int((frac or "0")[:6].ljust(6, "0"))
    t = _dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(microsecond=micros)
    if tz == "Z":
        return t.replace(tzinfo=_dt.timezone.utc)
    sign = 1 if tz[0] == "+" else -1
    hours, minutes = int(tz[1:3]), int(tz[4:6])
    return t.replace(tzinfo=_dt.timezone(sign * _dt.timedelta(hours=hours, minutes=minutes)))


def micro_time(t: _dt.datetime) -> str:
    """A ``MicroTime`` as the API server writes it."""
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Verdict = Literal["Take", "Wait", "Queue"]


def _duration(spec: Mapping[str, Any] | None, default_duration: float) -> float:
    d = (spec or {}).get("leaseDurationSeconds")
    return (
        float(d) if isinstance(d, int) and not isinstance(d, bool) and d > 0 else default_duration
    )


def _held(
    spec: Mapping[str, Any] | None,
    now: _dt.datetime,
    unchanged_for: float,
    clock_skew: float,
    duration: float,
) -> bool:
    if spec is None or not spec.get("holderIdentity"):
        return False
    if unchanged_for >= duration:
        return False
    renew = spec.get("renewTime")
    if renew:
        try:
            expiry = parse_time(renew) + _dt.timedelta(seconds=duration + clock_skew)
        except ValueError:
            return True
        if expiry <= now:
            return False
    return True


def fresh_slot(
    annotations: Mapping[str, str] | None,
    now: _dt.datetime,
    slot_unchanged_for: float,
    duration: float,
    clock_skew: float,
) -> str | None:
    """The queue slot's owner if its claim is fresh (pure): named, and neither its renew time
    plus ``duration`` plus ``clock_skew`` is past nor has it been unchanged for ``duration``.
    A claim without a readable renew time is stale.
    """
    owner = (annotations or {}).get(NEXT_ANNOTATION)
    renew = (annotations or {}).get(NEXT_RENEW_ANNOTATION)
    if not owner or not renew:
        return None
    try:
        until = parse_time(renew) + _dt.timedelta(seconds=duration + clock_skew)
    except ValueError:
        return None
    return owner if until > now and slot_unchanged_for < duration else None


def judge(
    spec: Mapping[str, Any] | None,
    now: _dt.datetime,
    unchanged_for: float,
    clock_skew: float,
    default_duration: float,
    *,
    annotations: Mapping[str, str] | None = None,
    me: str | None = None,
    slot_unchanged_for: float = 0.0,
) -> Verdict:
    """What a contender may do with a lease it just read (pure).

    ``now`` is its wall clock; ``unchanged_for`` how long it has seen the holder and
    ``renewTime`` unchanged, ``slot_unchanged_for`` the queue slot, on its monotonic clock
    (seconds). Without ``me`` (a contender outside the queue): ``Take`` when free or expired,
    else ``Wait``. With it: a free lease is ``Take`` unless another's claim on the slot is
    fresh (``Wait``); a lease held by a holder that expects the queue is ``Queue`` when the
    slot is empty, stale or ``me``'s, else ``Wait``; behind any other holder, ``Wait``.
    """
    duration = _duration(spec, default_duration)
    held = _held(spec, now, unchanged_for, clock_skew, duration)
    if me is None:
        return "Wait" if held else "Take"
    slot = fresh_slot(annotations, now, slot_unchanged_for, duration, clock_skew)
    others_queued = slot is not None and slot != me
    if not held:
        return "Wait" if others_queued else "Take"
    holder = (spec or {}).get("holderIdentity")
    fair = (annotations or {}).get(FAIR_HOLDER_ANNOTATION) == holder
    return "Queue" if fair and not others_queued else "Wait"


def taken_annotations(old: Mapping[str, str] | None, me: str) -> dict[str, str]:
    """The annotations written when taking a lease (pure): the slot cleared, the taker named
    as a holder that expects the queue.
    """
    a = {k: v for k, v in (old or {}).items() if k not in (NEXT_ANNOTATION, NEXT_RENEW_ANNOTATION)}
    a[FAIR_HOLDER_ANNOTATION] = me
    return a


def claimed_annotations(
    old: Mapping[str, str] | None, me: str, now: _dt.datetime
) -> dict[str, str]:
    """The annotations written when claiming or refreshing the queue slot (pure)."""
    return {**(old or {}), NEXT_ANNOTATION: me, NEXT_RENEW_ANNOTATION: micro_time(now)}


def withdrawn_annotations(old: Mapping[str, str] | None, me: str) -> dict[str, str] | None:
    """The annotations written by a contender that gives up waiting (pure): the slot cleared
    if it is still ``me``'s; ``None`` when it is not (nothing to write).
    """
    if old is None or old.get(NEXT_ANNOTATION) != me:
        return None
    return {k: v for k, v in old.items() if k not in (NEXT_ANNOTATION, NEXT_RENEW_ANNOTATION)}


def shared_hold(queue: bool, waited: bool, before: Mapping[str, str] | None, me: str) -> bool:
    """Whether a hold makes its holder yield after releasing it (pure): its acquisition had to
    wait for another party (waiting out its own yield does not count), or the Lease it took
    (``before``: its annotations as taken, ``None`` when it created the Lease) did not name
    ``me`` as its last fair holder. A contender outside the queue never yields.
    """
    return queue and (waited or (before or {}).get(FAIR_HOLDER_ANNOTATION) != me)


def yield_for(annotations: Mapping[str, str] | None, me: str, yield_left: float) -> float:
    """How much longer a contender whose verdict is ``Take`` leaves the free Lease to others
    (pure, seconds): ``yield_left`` (YIELD less the time since its last release of a shared
    hold) if the Lease still names ``me`` as its last fair holder and the queue slot is not
    ``me``'s, else 0. Only the last holder yields, so two harnesses that both released recently
    never both stand back.
    """
    a = annotations or {}
    if a.get(NEXT_ANNOTATION) == me or a.get(FAIR_HOLDER_ANNOTATION) != me:
        return 0.0
    return yield_left


def released_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec written when releasing (pure): no holder and no times; the duration and the
    fencing token kept. The annotations (the queue slot) are kept as they are.
    """
    return {
        k: v for k, v in spec.items() if k not in ("holderIdentity", "acquireTime", "renewTime")
    }


def taken_spec(
    old: Mapping[str, Any] | None, cfg: GuardConfig, now: _dt.datetime
) -> dict[str, Any]:
    """The spec written when taking a lease: this holder, times now, transitions bumped."""
    transitions = int((old or {}).get("leaseTransitions") or 0)
    t = micro_time(now)
    return {
        "acquireTime": t,
        "holderIdentity": cfg.holder,
        "leaseDurationSeconds": cfg.duration_secs,
        "leaseTransitions": min(transitions + 1, _I32_MAX),
        "renewTime": t,
    }


def _retryable(e: Exception) -> bool:
    if isinstance(e, TransportError):
        return True
    if isinstance(e, ApiError):
        return e.status >= 500 or e.status in (409, 429)
    return False


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _refresh_every(cfg: GuardConfig, lease_duration: float) -> float:
    """The queue claim's refresh period: a third of the shorter of the two durations."""
    return min(float(cfg.duration_secs), lease_duration) / 3


def _still_ours(lease: Mapping[str, Any] | None, holder: str, token: int) -> bool:
    """Still held by ``holder`` with fencing token ``token`` (whatever else changed: a
    contender's claim on the queue slot changes the ``resourceVersion`` only).
    """
    spec = (lease or {}).get("spec") or {}
    return spec.get("holderIdentity") == holder and int(spec.get("leaseTransitions") or 0) == token


class _Waiter:
    """A contender's state while it waits for one Lease."""

    def __init__(self, api: Kube, path: str, create_path: str, name: str, cfg: GuardConfig) -> None:
        self.api, self.path, self.create_path, self.name, self.cfg = (
            api,
            path,
            create_path,
            name,
            cfg,
        )
        self.me = cfg.holder
        self.holder_seen: tuple[str, float] | None = None
        self.slot_seen: tuple[str, float] | None = None
        self.last_holder = ""
        #: Whether this acquisition had to wait for another party (the guard is contended).
        self.waited = False
        #: The annotations of the Lease it took (None: it created it), for shared_hold.
        self.took_from: dict[str, str] | None = None
        #: Until when this contender yields a free Lease to others (see YIELD).
        self.yield_until: float | None = None
        #: When this contender last wrote its claim on the slot (None: it holds none).
        self.claimed_at: float | None = None
        self.wake = asyncio.Event()
        #: The Lease as the watch last delivered it, not yet judged: read instead of a GET (a
        #: waiter that reacts one request sooner claims the slot before a short turn ends).
        self.latest: dict[str, Any] | None = None
        self._watch: asyncio.Task[None] | None = None

    @staticmethod
    def _unchanged(seen: tuple[str, float] | None, key: str, now: float) -> tuple[str, float]:
        return seen if seen is not None and seen[0] == key else (key, now)

    async def step(
        self, labels: Mapping[str, str], may_queue: bool
    ) -> dict[str, Any] | Literal["again"] | tuple[str, float]:
        """One attempt: the lease once taken, ``"again"`` to read again at once, or
        ``(resourceVersion, lease duration)`` to wait for a change of the Lease.
        """
        loop = asyncio.get_running_loop()
        now = _now()
        current, self.latest = self.latest, None
        if current is None:
            current = await self.api.get_opt(self.path)
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "annotations": taken_annotations(None, self.me),
                    **({"labels": dict(labels)} if labels else {}),
                },
                "spec": taken_spec(None, self.cfg, now),
            }
            self.took_from = None
            try:
                return await self.api.call("POST", self.create_path, body=body)
            except ConflictError:
                return "again"
        meta = current.setdefault("metadata", {})
        rv = str(meta.get("resourceVersion") or "")
        spec = current.get("spec")
        ann: dict[str, str] = dict(meta.get("annotations") or {})
        holder = str((spec or {}).get("holderIdentity") or "")
        t = loop.time()
        self.holder_seen = self._unchanged(
            self.holder_seen, f"{holder}\n{(spec or {}).get('renewTime') or ''}", t
        )
        self.slot_seen = self._unchanged(
            self.slot_seen,
            f"{ann.get(NEXT_ANNOTATION, '')}\n{ann.get(NEXT_RENEW_ANNOTATION, '')}",
            t,
        )
        self.last_holder = holder
        verdict = judge(
            spec,
            now,
            t - self.holder_seen[1],
            self.cfg.clock_skew,
            self.cfg.lease_duration,
            annotations=ann,
            me=self.me,
            slot_unchanged_for=t - self.slot_seen[1],
        )
        duration = _duration(spec, self.cfg.lease_duration)
        if ann.get(NEXT_ANNOTATION) != self.me:
            self.claimed_at = None
        if verdict == "Wait":
            return rv, duration
        if verdict == "Queue":
            due = self.claimed_at is None or t - self.claimed_at >= _refresh_every(
                self.cfg, duration
            )
            if not may_queue or not due:
                return rv, duration
            meta["annotations"] = claimed_annotations(ann, self.me, _now())
            try:
                # Conditioned on the resourceVersion read: a 409 means the Lease changed.
                new = await self.api.call("PUT", self.path, body=current)
            except ConflictError:
                return "again"
            self.claimed_at = t
            return str((new.get("metadata") or {}).get("resourceVersion") or ""), duration
        grace = yield_for(ann, self.me, _yield_left(self.path, self.me))
        if grace > 0:
            # Just released after a shared hold: give whoever waited for it the time to claim
            # the slot or take it (ended early by a watch event showing it act).
            self.yield_until = t + grace
            return rv, duration
        self.took_from = dict(ann)
        current["spec"] = taken_spec(spec, self.cfg, now)
        meta["annotations"] = taken_annotations(ann, self.me)
        if labels:
            meta.setdefault("labels", {}).update(labels)
        try:
            # The body carries metadata.resourceVersion: the API server refuses (409) if
            # anyone wrote the lease since we read it.
            return await self.api.call("PUT", self.path, body=current)
        except ConflictError:
            return "again"

    def watch_from(self, rv: str) -> None:
        """Starts watching the Lease (once) from ``rv``: every event wakes the waiter."""
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watch_loop(rv))

    async def _watch_loop(self, rv: str) -> None:
        collection = self.create_path
        while True:
            query = {"fieldSelector": f"metadata.name={self.name}", "resourceVersion": rv}
            try:
                async for ev in self.api.watch(collection, query=query, timeout=240):
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = ""  # too old a version (410): start from now
                        self.wake.set()
                        break
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if ev.get("type") != "BOOKMARK":
                        self.latest = obj if ev.get("type") != "DELETED" else None
                        self.wake.set()
            except AgentboxError:
                # No watch permission, or no API server: poll instead.
                await asyncio.sleep(self.cfg.retry_interval * (0.5 + random.random()))
                rv = ""
                self.wake.set()

    async def close(self) -> None:
        """Stops watching and gives up the queue slot if this contender holds it (best effort:
        a claim left behind goes stale within a lease duration anyway).
        """
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        if self.claimed_at is None:
            return
        self.claimed_at = None
        with contextlib.suppress(Exception):
            for _ in range(3):
                lease = await self.api.get_opt(self.path)
                if lease is None:
                    return
                meta = lease.setdefault("metadata", {})
                a = withdrawn_annotations(meta.get("annotations") or {}, self.me)
                if a is None:
                    return
                meta["annotations"] = a
                try:
                    await self.api.call("PUT", self.path, body=lease)
                    return
                except ConflictError:
                    continue


class Guard:
    """The execution guard of one scope (its Lease). Get one from
    :meth:`agentbox.Sandbox.guard` and use it as an async context manager::

        async with sbx.guard(wait=60) as g:
            await sbx.exec(["make"], env={"FENCE": str(g.fencing_token)})

    Entering acquires (waiting up to ``wait`` seconds; ``None`` waits indefinitely, raising
    :class:`~agentbox.errors.GuardTimeoutError` at the deadline), leaving releases. If the
    lease is lost meanwhile, the block is cancelled and :class:`~agentbox.errors.GuardLostError`
    is raised from it. :meth:`acquire` and :meth:`release` do the same by hand.
    """

    def __init__(
        self,
        kube: KubeSource,
        namespace: str,
        lease_name: str,
        labels: Mapping[str, str],
        config: GuardConfig | None = None,
        wait: float | None = None,
    ) -> None:
        self._kube_source = kube
        self._k: Kube | None = None
        self._path = leases_path(namespace, lease_name)
        self._create_path = leases_path(namespace)
        self._labels = dict(labels)
        self._cfg = config or GuardConfig()
        self._wait = wait
        self._lease: dict[str, Any] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lost = asyncio.Event()
        self._released = False
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._contended = False
        #: Name of the Lease.
        self.lease_name = lease_name
        #: This holder's identity.
        self.holder = self._cfg.holder
        #: The fencing token (``leaseTransitions`` after this acquisition): strictly greater
        #: than any earlier holder's. 0 until acquired.
        self.fencing_token = 0
        #: When the lease was acquired (its ``acquireTime``).
        self.acquired_at: _dt.datetime | None = None

    @property
    def _api(self) -> Kube:
        if self._k is None:
            raise AgentboxError("guard not acquired")
        return self._k

    @property
    def is_lost(self) -> bool:
        """Whether the guard has been lost."""
        return self._lost.is_set()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called (the guard is no longer in use)."""
        return self._released

    @property
    def held(self) -> bool:
        """Acquired, not released and not lost."""
        return self._lease is not None and not self._released and not self.is_lost

    async def wait_lost(self) -> None:
        """Returns when the guard is lost."""
        await self._lost.wait()

    def check(self) -> None:
        """Raises :class:`~agentbox.errors.GuardLostError` if the guard was lost."""
        if self.is_lost and not self._released:
            raise GuardLostError(self.lease_name)

    async def acquire(self) -> Guard:
        """Takes the lease (waiting up to ``wait``) and starts renewing it. While it waits it
        holds the Lease's queue slot when it can and watches the Lease for a release.
        """
        if self._lease is not None:
            raise AgentboxError("guard already acquired")
        self._k = await self._kube_source()
        loop = asyncio.get_running_loop()
        deadline = None if self._wait is None else loop.time() + self._wait
        w = _Waiter(self._api, self._path, self._create_path, self.lease_name, self._cfg)
        try:
            while True:
                attempt = loop.time()
                may_queue = deadline is None or attempt < deadline
                try:
                    step = await w.step(self._labels, may_queue)
                except Exception as e:
                    if not _retryable(e) or (deadline is not None and loop.time() >= deadline):
                        raise
                    step = None
                if isinstance(step, dict):
                    w.claimed_at = None
                    self._contended = shared_hold(True, w.waited, w.took_from, self.holder)
                    self._start(step, attempt)
                    return self
                # Waiting out its own yield is not contention: a harness whose partner left
                # would otherwise yield again after every turn.
                if step is None or step == "again" or w.yield_until is None:
                    w.waited = True
                if step == "again":
                    # Lost a race: read the Lease itself at once. What the watch delivered so
                    # far may be what the 409 was about (the watch trails the API server).
                    w.latest = None
                    continue
                if step is None:
                    pause = self._cfg.retry_interval * (0.5 + random.random())
                else:
                    w.watch_from(step[0])
                    pause = min(WATCH_FALLBACK, self._cfg.renew_every)
                    if w.yield_until is not None:
                        pause = min(pause, max(0.0, w.yield_until - loop.time()))
                        w.yield_until = None
                    if w.claimed_at is not None:
                        due = w.claimed_at + _refresh_every(self._cfg, step[1])
                        pause = min(pause, max(0.0, due - loop.time()))
                if deadline is not None:
                    now = loop.time()
                    if now >= deadline:
                        raise GuardTimeoutError(self.lease_name, w.last_holder)
                    pause = min(pause, deadline - now)
                w.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(w.wake.wait(), pause)
        finally:
            await w.close()

    def _start(self, lease: dict[str, Any], sent: float) -> None:
        spec = lease.get("spec") or {}
        self._lease = lease
        self.fencing_token = int(spec.get("leaseTransitions") or 0)
        if spec.get("acquireTime"):
            self.acquired_at = parse_time(spec["acquireTime"])
        self._renewer = asyncio.ensure_future(self._renew_loop(sent))

    def _set_lost(self) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        if self._task is not None and not self._task.done():
            self._cancelled = True
            self._task.cancel(f"agentbox: lost lease {self.lease_name}")

    async def _renew_loop(self, last_ok: float) -> None:
        loop = asyncio.get_running_loop()
        every = self._cfg.renew_every
        trust = self._cfg.trust_window
        nxt = last_ok + every
        while True:
            trusted_until = last_ok + trust
            # Stopped only between renewals, never during one: a renewal the API server
            # applied but whose answer was dropped would leave a stale resourceVersion, and
            # the release's conditioned update would then fail as if the lease were taken.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._stop.wait(), max(0.0, min(nxt, trusted_until) - loop.time())
                )
            if self._stop.is_set():
                return
            if loop.time() >= trusted_until:
                self._set_lost()  # not renewed in time
                return
            attempt = loop.time()
            assert self._lease is not None
            body = dict(self._lease)
            body["spec"] = {**(body.get("spec") or {}), "renewTime": micro_time(_now())}
            try:
                new = await asyncio.wait_for(
                    self._api.call("PUT", self._path, body=body), trusted_until - loop.time()
                )
            except ConflictError:
                # Someone wrote the Lease: a contender's claim on the queue slot leaves it
                # ours (renew the fresh copy at once); anything else means it was taken.
                try:
                    cur = await asyncio.wait_for(
                        self._api.get_opt(self._path), max(0.0, trusted_until - loop.time())
                    )
                except asyncio.TimeoutError:
                    self._set_lost()
                    return
                except AgentboxError:
                    nxt = loop.time() + every / 4
                    continue
                if not _still_ours(cur, self.holder, self.fencing_token):
                    self._set_lost()
                    return
                assert cur is not None
                self._lease = cur
                nxt = loop.time()
                continue
            except NotFoundError:
                self._set_lost()
                return
            except asyncio.TimeoutError:
                self._set_lost()
                return
            except AgentboxError:
                nxt = loop.time() + every / 4
                continue
            self._lease = new
            last_ok = attempt
            nxt = attempt + every

    async def release(self) -> None:
        """Stops renewing and clears the holder with an update conditioned on the last
        ``resourceVersion``. Raises :class:`~agentbox.errors.GuardLostError` if the guard had
        been lost or someone wrote the lease in between.
        """
        if self._released:
            return
        self._released = True
        if self._renewer is not None:
            # Lets a renewal in flight finish (see _renew_loop).
            self._stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._lost.is_set():
            raise GuardLostError(self.lease_name)
        if self._lease is None:
            return
        lease: dict[str, Any] | None = self._lease
        # Released or failed, the guard is no longer ours to use.
        self._lost.set()
        for _ in range(5):
            assert lease is not None
            body = {**lease, "spec": released_spec(lease.get("spec") or {})}
            try:
                await self._api.call("PUT", self._path, body=body)
                if self._contended:
                    _RELEASED[(self._path, self.holder)] = asyncio.get_running_loop().time()
                return
            except NotFoundError:
                raise GuardLostError(self.lease_name) from None
            except ConflictError:
                # A queued contender's claim changed the resourceVersion: release the fresh
                # copy if it is still ours. The slot is kept.
                lease = await self._api.get_opt(self._path)
                if not _still_ours(lease, self.holder, self.fencing_token):
                    raise GuardLostError(self.lease_name) from None
        raise GuardLostError(self.lease_name)

    async def __aenter__(self) -> Guard:
        if self._lease is None:
            await self.acquire()
        self._task = asyncio.current_task()
        if self.is_lost:
            raise GuardLostError(self.lease_name)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        lost = self.is_lost and not self._released
        if self._cancelled and task is not None:
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
        try:
            await self.release()
        except GuardLostError:
            lost = True
        except AgentboxError:
            if exc is None:
                raise
        if lost:
            raise GuardLostError(self.lease_name) from exc
