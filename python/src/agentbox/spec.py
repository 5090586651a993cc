"""The Sandbox spec as dataclasses: every field of the CRD's ``spec`` (snake_case here,
camelCase on the wire). Core Kubernetes types (``env`` entries, ``resources``,
``tolerations``) are plain dicts in their JSON form.

The API server validates the spec (schema and CEL rules); what it refuses comes back as
:class:`~agentbox.errors.InvalidSpecError` with its message.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

from .scope import Scope

__all__ = [
    "Capabilities",
    "EgressAllow",
    "EgressPort",
    "FileSource",
    "GuardHold",
    "HostMount",
    "KeyRef",
    "Lifecycle",
    "Network",
    "Port",
    "Projection",
    "Retention",
    "SandboxSecurityContext",
    "SandboxSpec",
    "SnapshotPolicy",
    "WorkspaceFile",
    "WorkspaceSpec",
]


@dataclass
class KeyRef:
    """A key of a ConfigMap or Secret in the sandbox's namespace."""

    name: str
    key: str


@dataclass
class FileSource:
    """Where a file's content comes from: exactly one of the two."""

    config_map_key_ref: KeyRef | None = None
    secret_key_ref: KeyRef | None = None


@dataclass
class WorkspaceFile:
    """A file written into the workspace when it is initialised.

    ``path`` is relative to the workspace root; exactly one of ``content`` (UTF-8) and
    ``content_from``; ``mode`` as an int (``0o755``); ``ephemeral`` files are rewritten on every
    start.
    """

    path: str
    content: str | None = None
    content_from: FileSource | None = None
    mode: int | None = None
    ephemeral: bool = False


@dataclass
class Projection:
    """A ConfigMap projected into a workspace directory (one file per key)."""

    config_map: str
    path: str


@dataclass
class HostMount:
    """A host directory bind-mounted into the workspace (only under the operator's allowed
    prefixes).
    """

    path: str
    host_path: str
    read_only: bool = True
    type: Literal["Directory", "DirectoryOrCreate", "File"] = "Directory"


@dataclass
class WorkspaceSpec:
    """The workspace: its root in the container, what is written into it, and the most
    bytes it may hold (``size_limit``, a quantity such as ``"64Mi"``; None: the operator's
    default, Helm ``workspace.sizeLimit``; not with ``template_ref``). Past a hard limit a
    write fails with EDQUOT; where the node gives none, the sandbox is suspended once it holds
    more (condition ``WorkspaceLimited``; docs/security.md).
    """

    root: str = "/workspace"
    files: list[WorkspaceFile] = field(default_factory=list)
    projections: list[Projection] = field(default_factory=list)
    mounts: list[HostMount] = field(default_factory=list)
    size_limit: str | None = None


@dataclass
class Retention:
    """How many Ready snapshots of the scope to keep."""

    keep_last: int


@dataclass
class SnapshotPolicy:
    """Which snapshot a fresh workspace is restored from, and when snapshots are taken.

    ``restore`` is ``"Latest"`` (the newest Ready snapshot of the scope), ``"None"``, or
    ``"Named"`` with ``name``. ``when_lost``: what a start does when the workspace was lost
    (its node lost, its directory gone) and no snapshot can be restored: ``"StartFresh"`` (a
    fresh workspace, the loss reported) or ``"Fail"`` (no start, reason ``WorkspaceLost``).
    """

    restore: Literal["Latest", "None", "Named"] = "Latest"
    name: str | None = None
    on_stop: bool = False
    retention: Retention | None = None
    when_lost: Literal["StartFresh", "Fail"] = "StartFresh"


@dataclass
class GuardHold:
    """A hold of the scope's guard handed to the operator: the Lease's ``holder`` identity and
    fencing ``token`` while the caller holds it (see :meth:`agentbox.Sandbox.suspend`).
    """

    holder: str
    token: int


@dataclass
class Lifecycle:
    """Whether the sandbox has a pod (``Running``) or not (``Suspended``), when it ends, and
    after how long idle (Ready, its scope's guard free) it suspends itself: ``idle_timeout``, a
    duration such as ``"90s"``, ``"15m"`` or ``"1h30m"``, at least ``"10s"``. ``guard``: the
    hold under which ``mode`` was last set (``Sandbox.suspend(guard=...)`` sets it).
    """

    mode: Literal["Running", "Suspended"] = "Running"
    shutdown_time: _dt.datetime | str | None = None
    idle_timeout: str | None = None
    guard: GuardHold | None = None


@dataclass
class EgressPort:
    """A port (``end_port``: through that port) of an allowed destination."""

    port: int
    end_port: int | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


@dataclass
class EgressCredential:
    """A key of a Secret (``secret_name``, in the sandbox's namespace) that the egress proxy
    sends as the header ``header`` (``None``: ``Authorization``) to an exact domain entry's
    name, so the sandbox never holds it: the sandbox calls ``http://that-name/...`` through
    the proxy, which speaks TLS to the server, verifies it and sets the header. The Secret's
    annotation ``agentbox.dev/credential-domains`` must allow the domain (set by whoever owns
    the Secret); otherwise the sandbox gets no pod (reason ``CredentialRefused``).
    """

    secret_name: str
    key: str
    header: str | None = None


@dataclass
class EgressAllow:
    """An allowed destination and its ports (none: all): an address block in CIDR notation
    (``cidr``), or a DNS name (``domain``: ``pypi.org``, or ``*.github.com`` for the names below
    it) reached through agentbox's egress proxy. Exactly one of the two. An exact ``domain``
    may carry a ``credential`` the proxy adds at the hop.
    """

    cidr: str | None = None
    ports: list[EgressPort] = field(default_factory=list)
    # After ports: positional construction (cidr, ports) keeps its meaning.
    domain: str | None = None
    credential: EgressCredential | None = None


@dataclass
class Network:
    """What the sandbox may reach.

    ``egress``: ``"None"`` (nothing), ``"All"``, or ``"Allowlist"`` (only ``allow``);
    ``None`` (unset): the cluster's default, ``"None"`` unless the administrator changed it.
    Editable while the sandbox runs. A sandbox relying on a policy is Ready only where the
    operator proved NetworkPolicy is enforced (condition ``NetworkEnforced``).
    """

    egress: Literal["All", "None", "Allowlist"] | None = None
    allow: list[EgressAllow] = field(default_factory=list)


@dataclass
class Port:
    """A port of the sandbox to expose (``spec.ports``): the operator keeps a Service that
    selects only this sandbox's pod and records where the port is reached in
    :attr:`agentbox.Sandbox.endpoints`. ``name``: lower-case letters, digits and ``-``, starting
    with a letter, at most 15 characters, unique in the sandbox.
    """

    name: str
    port: int
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


@dataclass
class Capabilities:
    """Changes to the sandbox container's default capability set.

    ``drop`` removes capabilities of the default set (``"ALL"`` drops them all); ``add`` adds
    others, each of which the operator must allow (``--allowed-capabilities``). Names as in
    Kubernetes, without ``CAP_`` (e.g. ``"NET_RAW"``).
    """

    add: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)


@dataclass
class SandboxSecurityContext:
    """The few security settings a sandbox may choose."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    read_only_root_filesystem: bool | None = None
    capabilities: Capabilities | None = None


@dataclass
class TemplateRef:
    """The SandboxTemplate (same namespace) a Sandbox is made from."""

    name: str


@dataclass
class SandboxSpec:
    """Desired state of a Sandbox (every field of the CRD's ``spec``).

    ``scope`` may be left out when the spec goes to
    :meth:`agentbox.Sandboxes.get_or_create`, which sets it. ``env`` takes a ``{name: value}``
    mapping or a list of Kubernetes ``EnvVar`` dicts.

    Either ``image`` or ``template_ref`` (see :meth:`from_template`): a Sandbox made from a
    SandboxTemplate leaves the pod-shaping fields (image, command, resources, security,
    network, ports, projections...) to it and may add ``env`` (appended; the same name
    replaces the template's), ``workspace.files`` (added; the same path replaces the
    template's), ``snapshot`` and ``lifecycle`` (``kubectl explain sandbox.spec.templateRef``).
    """

    image: str | None = None
    template_ref: TemplateRef | None = None
    scope: Scope | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: Mapping[str, str] | list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, Any] | None = None
    runtime_class_name: str | None = None
    # The most processes and threads the sandbox's pod may have at once (16 to 4194304);
    # None: the operator's default (Helm ``processLimit``). Not with ``template_ref``.
    process_limit: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    security_context: SandboxSecurityContext | None = None
    workspace: WorkspaceSpec = field(default_factory=WorkspaceSpec)
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    network: Network = field(default_factory=Network)
    ports: list[Port] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The spec's JSON form (camelCase; unset fields left out so the server defaults
        them).
        """
        out = _to_json(self)
        assert isinstance(out, dict)
        if isinstance(self.env, Mapping):
            out["env"] = [{"name": k, "value": v} for k, v in self.env.items()]
            if not out["env"]:
                del out["env"]
        return out

    @classmethod
    def from_template(cls, template: str, **fields: Any) -> SandboxSpec:
        """A spec made from the SandboxTemplate ``template``, with the other ``fields`` the
        template allows (``env``, ``workspace``, ``snapshot``, ``lifecycle``, ``scope``).
        """
        return cls(template_ref=TemplateRef(template), **fields)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        """Reads a spec's JSON form (fields this version does not know are ignored)."""
        spec = _from_json(cls, data)
        if isinstance(data.get("scope"), Mapping):
            spec.scope = Scope.from_dict(data["scope"])
        return spec


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _to_json(value: Any) -> Any:
    if isinstance(value, Scope):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = _to_json(getattr(value, f.name))
            if v is None or (isinstance(v, (list, dict)) and not v):
                continue
            out[_camel(f.name)] = v
        return out
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


_T = TypeVar("_T")


def _from_json(cls: type[_T], data: Mapping[str, Any]) -> _T:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = _camel(f.name)
        if key in data and data[key] is not None:
            kwargs[f.name] = _decode(hints[f.name], data[key])
    return cls(**kwargs)


def _decode(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                return _decode(arg, value)
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_decode(item, v) for v in value]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp is not Scope:
        return _from_json(tp, value)
    return value
