"""The sync facade has every public method, property and attribute of the async classes it
wraps, with the same parameters (names, kinds and defaults), so that ``agentbox.sync`` is the
same API; and the errors each module defines are all in its ``__all__`` and at the top level.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import ModuleType

import pytest

import agentbox
from agentbox import client, errors, guard, ports, session, sync
from agentbox import exec as exec_

#: (async class, its sync counterpart).
PAIRS = [
    (client.Sandboxes, sync.Sandboxes),
    (client.Sandbox, sync.Sandbox),
    (exec_.ExecStream, sync.ExecStream),
    (session.Session, sync.Session),
    (guard.Guard, sync.Guard),
    (ports.PortForward, sync.PortForward),
]

#: The async protocol's names and the sync names that stand for them.
SYNC_NAME = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "aclose": "close",
}

#: Async members with no sync counterpart, and why.
ASYNC_ONLY = {
    # The API client of the async core: it lives on the sync facade's private event loop, where
    # sync code cannot await it.
    ("Sandboxes", "kube"),
    # Sync code has no awaitable to wait on; inside a sync guard block every agentbox call is
    # cancelled when the guard is lost (agentbox._portal).
    ("Guard", "wait_lost"),
}


def public_members(cls: type) -> dict[str, object]:
    """The class's own public members (methods, properties), inherited ones of the SDK's
    classes included, those of ``object`` left out, plus the async protocol's dunders.
    """
    out: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if not name.startswith("_") or name in SYNC_NAME or name in SYNC_NAME.values():
                out[name] = member
    return out


def instance_attributes(cls: type) -> set[str]:
    """The public attributes ``__init__`` assigns (``self.name = ...``)."""
    init = vars(cls).get("__init__")
    if init is None:
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    names = set()
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and not t.attr.startswith("_")
            ):
                names.add(t.attr)
    return names


def parameters(member: object) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter but ``self``."""
    sig = inspect.signature(member)  # type: ignore[arg-type]
    return [
        (p.name, p.kind, p.default) for p in list(sig.parameters.values())[1:] if p.name != "self"
    ]


@pytest.mark.parametrize(("aio", "facade"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_the_sync_class_has_every_public_member_of_the_async_one(aio: type, facade: type) -> None:
    theirs = public_members(facade)
    missing, different = [], []
    for name, member in sorted(public_members(aio).items()):
        if (aio.__name__, name) in ASYNC_ONLY:
            assert SYNC_NAME.get(name, name) not in theirs, f"{name}: no longer async-only"
            continue
        sync_name = SYNC_NAME.get(name, name)
        mine = theirs.get(sync_name)
        if mine is None:
            missing.append(name)
        elif isinstance(member, property):
            if not isinstance(mine, property):
                different.append(f"{name}: a property, but {mine!r} in sync")
        elif callable(member):
            if not callable(mine):
                different.append(f"{name}: not callable in sync")
            elif name not in SYNC_NAME and parameters(member) != parameters(mine):
                different.append(f"{name}{inspect.signature(member)} != {inspect.signature(mine)}")
    for name in sorted(instance_attributes(aio)):
        if name not in theirs and name not in instance_attributes(facade):
            missing.append(name)
    assert not missing, f"sync.{facade.__name__} lacks {missing}"
    assert not different, different


def test_the_facade_covers_every_async_class_it_returns() -> None:
    # Every public class of the async modules with an async method is paired above.
    paired = {a for a, _ in PAIRS}
    for module in (client, exec_, session, guard, ports):
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            if name.startswith("_") or issubclass(cls, BaseException):
                continue
            if any(inspect.iscoroutinefunction(m) for m in vars(cls).values()):
                assert cls in paired, f"{module.__name__}.{name} has no sync counterpart"


@pytest.mark.parametrize("module", [errors, exec_], ids=lambda m: m.__name__)
def test_every_error_is_exported(module: ModuleType) -> None:
    defined = {
        name
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == module.__name__
        and not name.startswith("_")
    }
    assert defined
    exported = set(module.__all__)
    assert defined <= exported, f"not in {module}.__all__: {defined - exported}"
    assert defined <= set(agentbox.__all__), f"not in agentbox: {defined - set(agentbox.__all__)}"
    for name in defined:
        assert getattr(agentbox, name) is getattr(module, name)
