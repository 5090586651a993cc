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
a clock-skew allowance is past, or this contender has seen the same ``resourceVersion`` for a
whole lease duration on its own monotonic clock.
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


def judge(
    spec: Mapping[str, Any] | None,
    now: _dt.datetime,
    unchanged_for: float,
    clock_skew: float,
    default_duration: float,
) -> Literal["Take", "Wait"]:
    """Whether a contender may take over a lease it just read (pure).

    ``now`` is its wall clock; ``unchanged_for`` how long it has seen the current
    ``resourceVersion`` on its monotonic clock (seconds).
    """
    if spec is None:
        return "Take"
    if not spec.get("holderIdentity"):
        return "Take"
    d = spec.get("leaseDurationSeconds")
    duration = float(d) if isinstance(d, int) and d > 0 else default_duration
    if unchanged_for >= duration:
        return "Take"
    renew = spec.get("renewTime")
    if renew:
        try:
            expiry = parse_time(renew) + _dt.timedelta(seconds=duration + clock_skew)
        except ValueError:
            return "Wait"
        if expiry <= now:
            return "Take"
    return "Wait"


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
        """Takes the lease (waiting up to ``wait``) and starts renewing it."""
        if self._lease is not None:
            raise AgentboxError("guard already acquired")
        self._k = await self._kube_source()
        loop = asyncio.get_running_loop()
        deadline = None if self._wait is None else loop.time() + self._wait
        seen: list[Any] = [None, 0.0]  # resourceVersion last seen, since when (monotonic)
        last_holder = ""
        while True:
            attempt = loop.time()
            try:
                lease, last_holder = await self._try_take(seen, last_holder)
            except Exception as e:
                if not _retryable(e) or (deadline is not None and loop.time() >= deadline):
                    raise
                lease = None
            if lease is not None:
                self._start(lease, attempt)
                return self
            pause = self._cfg.retry_interval * (0.5 + random.random())
            if deadline is not None:
                now = loop.time()
                if now >= deadline:
                    raise GuardTimeoutError(self.lease_name, last_holder)
                pause = min(pause, deadline - now)
            await asyncio.sleep(pause)

    async def _try_take(
        self, seen: list[Any], last_holder: str
    ) -> tuple[dict[str, Any] | None, str]:
        loop = asyncio.get_running_loop()
        now = _now()
        current = await self._api.get_opt(self._path)
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.lease_name,
                    **({"labels": self._labels} if self._labels else {}),
                },
                "spec": taken_spec(None, self._cfg, now),
            }
            try:
                return await self._api.call("POST", self._create_path, body=body), last_holder
            except ConflictError:
                return None, last_holder
        rv = current.get("metadata", {}).get("resourceVersion", "")
        if seen[0] != rv:
            seen[0], seen[1] = rv, loop.time()
        spec = current.get("spec")
        last_holder = str((spec or {}).get("holderIdentity") or "")
        if (
            judge(spec, now, loop.time() - seen[1], self._cfg.clock_skew, self._cfg.lease_duration)
            == "Wait"
        ):
            return None, last_holder
        current["spec"] = taken_spec(spec, self._cfg, now)
        if self._labels:
            current.setdefault("metadata", {}).setdefault("labels", {}).update(self._labels)
        try:
            # The body carries metadata.resourceVersion: the API server refuses (409) if
            # anyone wrote the lease since we read it.
            return await self._api.call("PUT", self._path, body=current), last_holder
        except ConflictError:
            return None, last_holder

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
            except (ConflictError, NotFoundError):
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
        body = dict(self._lease)
        spec = {
            k: v
            for k, v in (body.get("spec") or {}).items()
            if k not in ("holderIdentity", "acquireTime", "renewTime")
        }
        body["spec"] = spec
        # Released or failed, the guard is no longer ours to use.
        self._lost.set()
        try:
            await self._api.call("PUT", self._path, body=body)
        except (ConflictError, NotFoundError):
            raise GuardLostError(self.lease_name) from None

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
