"""Isolation scopes: which ids identify a sandbox's lineage (``spec.scope`` of a Sandbox)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from .errors import InvalidRequestError

__all__ = ["Scope", "ScopeKind"]

#: Longest id the CRD accepts.
MAX_ID = 253


class ScopeKind(str, enum.Enum):
    """Kind of isolation scope (the CRD's ``scope.kind``)."""

    #: One agent session: needs ``agent`` and ``session``.
    SESSION = "Session"
    #: One user of one agent, across sessions: needs ``agent`` and ``user``.
    USER = "User"
    #: One agent, shared by all its users: needs ``agent``.
    AGENT = "Agent"
    #: One lineage for everything: takes no ids.
    GLOBAL = "Global"

    @property
    def label_value(self) -> str:
        """The lower-case form used in the ``agentbox.dev/scope`` label."""
        return self.value.lower()


# Which ids each kind requires; the others must be absent (the CRD's CEL rules).
_REQUIRED: dict[ScopeKind, tuple[str, ...]] = {
    ScopeKind.SESSION: ("agent", "session"),
    ScopeKind.USER: ("agent", "user"),
    ScopeKind.AGENT: ("agent",),
    ScopeKind.GLOBAL: (),
}


@dataclass(frozen=True)
class Scope:
    """An isolation scope. Validated on construction with the CRD's own rules, so a bad scope
    fails here, before any request.

    Build one with :meth:`for_session`, :meth:`for_user`, :meth:`for_agent` or
    :meth:`for_global`, or
    directly: ``Scope(ScopeKind.USER, agent="coder", user="alice@example.com")``. Ids are any
    strings of 1 to 253 characters (they need not be valid label values).
    """

    kind: ScopeKind
    agent: str | None = None
    user: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        try:
            kind = ScopeKind(self.kind)
        except ValueError:
            raise InvalidRequestError(
                f"scope.kind must be one of Session, User, Agent, Global, not {self.kind!r}"
            ) from None
        object.__setattr__(self, "kind", kind)
        required = _REQUIRED[kind]
        for field in ("agent", "user", "session"):
            value = getattr(self, field)
            if field in required:
                if value is None:
                    raise InvalidRequestError(f"scope.{field} is required for a {kind.value} scope")
                if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID:
                    raise InvalidRequestError(
                        f"scope.{field} must be a string of 1 to {MAX_ID} characters"
                    )
            elif value is not None:
                raise InvalidRequestError(f"scope.{field} is not used by a {kind.value} scope")

    @classmethod
    def for_session(cls, agent: str, session: str) -> Scope:
        """One session of an agent."""
        return cls(ScopeKind.SESSION, agent=agent, session=session)

    @classmethod
    def for_user(cls, agent: str, user: str) -> Scope:
        """One user of an agent, across sessions."""
        return cls(ScopeKind.USER, agent=agent, user=user)

    @classmethod
    def for_agent(cls, agent: str) -> Scope:
        """One agent, shared by all its users."""
        return cls(ScopeKind.AGENT, agent=agent)

    @classmethod
    def for_global(cls) -> Scope:
        """The single global lineage."""
        return cls(ScopeKind.GLOBAL)

    def to_dict(self) -> dict[str, str]:
        """The CRD's JSON form (``{"kind": "User", "agent": ..., "user": ...}``)."""
        out = {"kind": self.kind.value}
        for field in ("agent", "user", "session"):
            value = getattr(self, field)
            if value is not None:
                out[field] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scope:
        """Reads the CRD's JSON form."""
        # __post_init__ turns the string into a ScopeKind, or refuses it.
        return cls(
            cast(ScopeKind, data.get("kind")),
            agent=data.get("agent"),
            user=data.get("user"),
            session=data.get("session"),
        )
