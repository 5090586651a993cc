"""SandboxSnapshots from the harness side: ask the operator for one, wait for it, list a
scope's lineage. The workspace bytes never pass through the harness: the operator streams
them from the pod to the object store and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import labels as _labels
from ._kube import GROUP, VERSION, Kube, snapshots_path
from ._watch import watch_until
from .errors import NotFoundError, SnapshotFailedError
from .scope import Scope

__all__ = ["Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """A SandboxSnapshot as last read: one immutable workspace tarball in the object store."""

    #: Its name (what ``restore`` takes).
    name: str
    #: The Sandbox it was taken from.
    sandbox: str
    #: ``Pending``, ``Running``, ``Ready`` or ``Failed`` (``""`` before the operator saw it).
    phase: str
    #: Scope key of its sandbox.
    scope_key: str
    #: Hex SHA-256 of the tarball, once Ready.
    sha256: str | None = None
    #: Size of the tarball in bytes, once Ready.
    size_bytes: int | None = None
    #: Archive members, once Ready.
    members: int | None = None
    #: Fencing token of the guard it was taken under.
    fencing_token: int | None = None
    #: Key of the tarball in the object store.
    object_key: str | None = None
    #: Creation time (RFC 3339).
    created_at: str = ""
    #: When it became Ready or Failed (RFC 3339).
    completed_at: str | None = None
    #: The object as read from the API server.
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Snapshot:
        """Reads a SandboxSnapshot object."""
        meta = obj.get("metadata") or {}
        st = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            sandbox=str(((obj.get("spec") or {}).get("sandboxRef") or {}).get("name", "")),
            phase=str(st.get("phase") or ""),
            scope_key=str(
                st.get("scopeKey") or (meta.get("labels") or {}).get(_labels.SCOPE_KEY, "")
            ),
            sha256=st.get("sha256"),
            size_bytes=st.get("sizeBytes"),
            members=st.get("members"),
            fencing_token=st.get("fencingToken"),
            object_key=st.get("objectKey"),
            created_at=str(meta.get("creationTimestamp") or ""),
            completed_at=st.get("completedAt"),
            raw=obj,
        )


def failing_condition(obj: Mapping[str, Any]) -> tuple[str, str]:
    """Reason and message of the condition that explains why an object is not Ready: a
    ``Stalled`` condition that is True (the start cannot go on), else its Ready condition when
    that is not True, else any False condition (as Rust's client).
    """
    conds = (obj.get("status") or {}).get("conditions") or []
    pick = next(
        (c for c in conds if c.get("type") == "Stalled" and c.get("status") == "True"), None
    )
    if pick is None:
        pick = next(
            (c for c in conds if c.get("type") == "Ready" and c.get("status") != "True"), None
        )
    if pick is None:
        pick = next((c for c in conds if c.get("status") == "False"), None)
    if pick is None:
        return "", ""
    return str(pick.get("reason") or ""), str(pick.get("message") or "")


async def create(
    kube: Kube,
    namespace: str,
    sandbox: str,
    scope: Scope,
    name: str | None,
    deletion_policy: Literal["Delete", "Retain"],
    *,
    guard: Mapping[str, Any] | None = None,
) -> Snapshot:
    """Creates a SandboxSnapshot of ``sandbox`` (named ``<sandbox>-<random>`` without a
    name), labelled with its scope; ``guard``: the hold of the scope's guard it is taken under
    (``spec.guard``).
    """
    meta: dict[str, Any] = {"labels": _labels.scope_labels(scope)}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"{sandbox}-"
    spec: dict[str, Any] = {"sandboxRef": {"name": sandbox}, "deletionPolicy": deletion_policy}
    if guard is not None:
        spec["guard"] = dict(guard)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": meta,
        "spec": spec,
    }
    return Snapshot.from_object(await kube.call("POST", snapshots_path(namespace), body=body))


async def get(kube: Kube, namespace: str, name: str) -> Snapshot:
    """One SandboxSnapshot."""
    obj = await kube.get_opt(snapshots_path(namespace, name))
    if obj is None:
        raise NotFoundError(f"sandboxsnapshot {namespace}/{name} not found")
    return Snapshot.from_object(obj)


async def wait(kube: Kube, namespace: str, name: str, timeout: float) -> Snapshot:
    """Waits (with a watch) until the snapshot is Ready; raises
    :class:`~agentbox.errors.SnapshotFailedError` at once when it fails, or at the timeout.
    """

    def decide(obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            raise NotFoundError(f"sandboxsnapshot {namespace}/{name} was deleted")
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Failed":
            reason, message = failing_condition(obj)
            raise SnapshotFailedError(name, "Failed", reason or "Failed", message)
        return phase == "Ready"

    obj = await watch_until(kube, snapshots_path(namespace), name, decide, timeout)
    if obj is None:
        last = await kube.get_opt(snapshots_path(namespace, name))
        phase = str(((last or {}).get("status") or {}).get("phase") or "Pending")
        raise SnapshotFailedError(name, phase, "Timeout", f"not Ready after {timeout}s")
    return Snapshot.from_object(obj)


async def lineage(kube: Kube, namespace: str, selector: str) -> list[Snapshot]:
    """The snapshots matching a label selector, oldest first in the operator's order
    (completion time, then fencing token, then name; unfinished ones first).
    """
    data = await kube.call("GET", snapshots_path(namespace), query={"labelSelector": selector})
    snaps = [Snapshot.from_object(o) for o in data.get("items") or []]
    snaps.sort(key=age)
    return snaps


def age(s: Snapshot) -> tuple[bool, str, int, str]:
    """A snapshot's place in its scope's order, as the operator's ``snapshot::age``:
    completion time (whole seconds), then the fencing token (a new guard acquisition per
    snapshot orders those completed within one second), then the name.
    """
    return (s.completed_at is not None, s.completed_at or "", s.fencing_token or 0, s.name)
