"""Scope keys, label and annotation keys, and the names agentbox derives for its objects.

The same functions as the Rust crate's ``agentbox_api::labels``, checked against the vectors it
generates (``tests/vectors/protocol.json``): a Sandbox or Lease named here is the one the
operator, the CLI and Rust harnesses use for the same scope.
"""

from __future__ import annotations

import hashlib
import re

from .scope import Scope, ScopeKind

__all__ = [
    "AGENT",
    "AGENT_ID",
    "MANAGED_BY",
    "MANAGER",
    "SANDBOX",
    "SCOPE",
    "SCOPE_KEY",
    "SESSION",
    "SESSION_ID",
    "USER",
    "USER_ID",
    "bounded_name",
    "is_valid_label_value",
    "lease_name",
    "pod_name",
    "sandbox_label_value",
    "sandbox_name_for_scope",
    "scope_annotations",
    "scope_key",
    "scope_labels",
    "scope_selector",
]

#: Label: scope kind (``session``, ``user``, ``agent``, ``global``).
SCOPE = "agentbox.dev/scope"
#: Label: the scope key (see :func:`scope_key`).
SCOPE_KEY = "agentbox.dev/scope-key"
#: Label: readable agent id, only when it is a valid label value.
AGENT = "agentbox.dev/agent"
#: Label: readable user id, only when it is a valid label value.
USER = "agentbox.dev/user"
#: Label: readable session id, only when it is a valid label value.
SESSION = "agentbox.dev/session"
#: Label: the Sandbox an object belongs to.
SANDBOX = "agentbox.dev/sandbox"
#: Label: the standard managed-by label.
MANAGED_BY = "app.kubernetes.io/managed-by"
#: Value of :data:`MANAGED_BY` on everything agentbox makes.
MANAGER = "agentbox"
#: Annotation: raw agent id.
AGENT_ID = "agentbox.dev/agent-id"
#: Annotation: raw user id.
USER_ID = "agentbox.dev/user-id"
#: Annotation: raw session id.
SESSION_ID = "agentbox.dev/session-id"

#: Hex characters of a scope key.
SCOPE_KEY_LEN = 40
#: Longest label value and DNS-1123 label.
MAX_LABEL = 63

_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _ids(scope: Scope) -> tuple[str | None, str | None, str | None]:
    """The ids that identify a scope of its kind: agent, user, session."""
    if scope.kind is ScopeKind.SESSION:
        return scope.agent, None, scope.session
    if scope.kind is ScopeKind.USER:
        return scope.agent, scope.user, None
    if scope.kind is ScopeKind.AGENT:
        return scope.agent, None, None
    return None, None, None


def scope_key(scope: Scope) -> str:
    """Hex SHA-256 over a versioned tag, the kind and each id (length-prefixed, so ``a``+``bc``
    and ``ab``+``c`` differ), truncated to 40 characters.
    """
    h = hashlib.sha256()
    h.update(b"agentbox.dev/scope-key/v1\0")
    h.update(scope.kind.label_value.encode())
    for v in _ids(scope):
        if v is None:
            h.update(b"\x00")
        else:
            raw = v.encode()
            h.update(b"\x01")
            h.update(len(raw).to_bytes(8, "big"))
            h.update(raw)
    return h.hexdigest()[:SCOPE_KEY_LEN]


def is_valid_label_value(value: str) -> bool:
    """Whether ``value`` is a valid Kubernetes label value (empty, or up to 63 characters of
    ``[A-Za-z0-9._-]`` starting and ending with an alphanumeric).
    """
    if value == "":
        return True
    return len(value) <= MAX_LABEL and value.isascii() and _LABEL_VALUE.fullmatch(value) is not None


def scope_labels(scope: Scope) -> dict[str, str]:
    """Labels every object of a scope carries: kind, key, managed-by, and the readable ids
    that are valid (non-empty) label values.
    """
    labels = {
        SCOPE: scope.kind.label_value,
        SCOPE_KEY: scope_key(scope),
        MANAGED_BY: MANAGER,
    }
    for key, v in zip((AGENT, USER, SESSION), _ids(scope), strict=True):
        if v and is_valid_label_value(v):
            labels[key] = v
    return labels


def scope_annotations(scope: Scope) -> dict[str, str]:
    """Annotations holding the raw ids of a scope."""
    return {
        key: v
        for key, v in zip((AGENT_ID, USER_ID, SESSION_ID), _ids(scope), strict=True)
        if v is not None
    }


def scope_selector(scope: Scope) -> str:
    """A label selector matching every object of a scope."""
    return f"{SCOPE_KEY}={scope_key(scope)}"


def bounded_name(base: str, max_len: int) -> str:
    """``base`` when it fits in ``max_len``; else a prefix, ``-`` and 16 hex characters of its
    SHA-256 (the prefix trimmed of trailing ``-``/``.``), so long names stay distinct.
    """
    if len(base.encode()) <= max_len:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()
    prefix = base[: max(max_len - 17, 0)].rstrip("-.")
    return f"{prefix}-{digest[:16]}"


def sandbox_name_for_scope(scope: Scope) -> str:
    """The Sandbox name of a scope (deterministic, so racing creators get one object)."""
    return f"{scope.kind.label_value}-{scope_key(scope)[:24]}"


def pod_name(sandbox: str) -> str:
    """The pod name of a sandbox."""
    return bounded_name(f"sbx-{sandbox}", MAX_LABEL)


def sandbox_label_value(sandbox: str) -> str:
    """The :data:`SANDBOX` label value of a sandbox."""
    return bounded_name(sandbox, MAX_LABEL)


def lease_name(key: str) -> str:
    """The execution-guard Lease name of a scope key."""
    return f"agentbox-guard-{key}"
