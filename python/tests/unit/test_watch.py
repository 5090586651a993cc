"""watch_until against a scripted API server: refusals that pass by themselves (429 while a
CRD's storage is re-initialised, 5xx) are waited out; others are raised at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import pytest

from agentbox import _watch
from agentbox._kube import Kube
from agentbox.errors import ApiError, InvalidSpecError, TransportError


class Forever:
    """A script item that is never used up."""

    def __init__(self, item: Any) -> None:
        self.item = item


def take(script: list[Any]) -> Any:
    """The next item of a script (a :class:`Forever` one stays)."""
    if isinstance(script[0], Forever):
        return script[0].item
    return script.pop(0)


class ScriptedKube:
    """Answers GETs and watches from scripts: an item is an object (or ``None``) to return, a
    list of watch events to yield, or an exception to raise."""

    def __init__(self, gets: list[Any], watches: list[Any]) -> None:
        self.gets = gets
        self.watches = watches

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        item = take(self.gets)
        if isinstance(item, BaseException):
            raise item
        return cast("dict[str, Any] | None", item)

    async def watch(
        self, path: str, *, query: Mapping[str, str], timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        item = take(self.watches)
        if isinstance(item, BaseException):
            raise item
        for ev in item:
            yield ev


def obj(phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "s", "resourceVersion": "1"}, "status": {"phase": phase}}


def ready(o: Mapping[str, Any] | None) -> bool:
    return o is not None and o["status"]["phase"] == "Ready"


async def until(kube: ScriptedKube, timeout: float = 10.0) -> dict[str, Any] | None:
    return await _watch.watch_until(cast(Kube, kube), "/c", "s", ready, timeout)


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_watch, "RETRY_PAUSE", 0.0)


async def test_a_429_on_the_watch_or_the_read_is_waited_out() -> None:
    storage = ApiError(429, "TooManyRequests", "storage is (re)initializing")
    kube = ScriptedKube(
        gets=[obj("Pending"), storage, obj("Pending")],
        watches=[storage, [{"type": "MODIFIED", "object": obj("Ready")}]],
    )
    got = await until(kube)
    assert got is not None and got["status"]["phase"] == "Ready"
    assert kube.gets == [] and kube.watches == []


async def test_a_5xx_is_waited_out_and_a_dropped_watch_read_again() -> None:
    kube = ScriptedKube(
        gets=[obj("Pending"), obj("Pending"), obj("Ready")],
        watches=[ApiError(503, "ServiceUnavailable", "busy"), TransportError("dropped")],
    )
    got = await until(kube)
    assert got is not None and got["status"]["phase"] == "Ready"


@pytest.mark.parametrize(
    "err",
    [InvalidSpecError(422, "Invalid", "no"), ApiError(403, "Forbidden", "no")],
)
async def test_other_refusals_are_raised(err: ApiError) -> None:
    kube = ScriptedKube(gets=[obj("Pending")], watches=[err])
    with pytest.raises(type(err)):
        await until(kube)


async def test_an_unreachable_server_on_the_first_read_is_raised() -> None:
    kube = ScriptedKube(gets=[TransportError("refused")], watches=[])
    with pytest.raises(TransportError):
        await until(kube)


async def test_refusals_until_the_deadline_end_in_none() -> None:
    storage = ApiError(429, "TooManyRequests", "storage is (re)initializing")
    kube = ScriptedKube(gets=[Forever(storage)], watches=[])
    assert await until(kube, timeout=0.05) is None


def test_which_refusals_pass_by_themselves() -> None:
    assert _watch.transient(ApiError(429, "TooManyRequests", ""))
    assert _watch.transient(ApiError(500, "InternalError", ""))
    assert not _watch.transient(ApiError(404, "NotFound", ""))
    assert not _watch.transient(ApiError(409, "Conflict", ""))
