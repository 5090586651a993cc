"""Exposed ports and recovery, the pure parts: endpoints from status, port-forward frames,
ports in the spec, and when a sandbox serves in its live pod."""

from __future__ import annotations

import pytest

import agentbox
from agentbox.client import serving
from agentbox.ports import ChannelReader, Endpoint, PortForward, data_frame


def test_port_forward_frames_drop_the_port_headers_and_keep_errors_apart() -> None:
    r = ChannelReader()
    assert r.feed(b"\x00\x90\x1f") == b""  # data channel header: port 8080
    assert r.feed(b"\x01\x90\x1f") == b""  # error channel header
    assert r.feed(b"\x00hello") == b"hello"
    assert r.feed(b"\x01boom") == b""
    assert bytes(r.error) == b"boom"
    assert data_frame(b"GET /") == b"\x00GET /"


def test_endpoints_read_from_status_and_bad_ports_are_refused_before_any_request() -> None:
    e = Endpoint.from_status(
        {
            "name": "http",
            "port": 8080,
            "protocol": "TCP",
            "host": "sbx-a.ns.svc",
            "podIP": "10.1.2.3",
        }
    )
    assert (e.name, e.port, e.host, e.pod_ip) == ("http", 8080, "sbx-a.ns.svc", "10.1.2.3")
    assert Endpoint.from_status({"name": "h", "port": 1, "host": "x"}).pod_ip is None

    async def no_kube() -> agentbox._kube.Kube:
        raise AssertionError("no request expected")

    with pytest.raises(agentbox.InvalidRequestError):
        PortForward(no_kube, "ns", "pod", 0)
    with pytest.raises(agentbox.InvalidRequestError):
        PortForward(no_kube, "ns", "pod", 80, local_port=70000)


def test_ports_are_part_of_the_spec() -> None:
    spec = agentbox.SandboxSpec(image="img", ports=[agentbox.Port("dns", 53, "UDP")])
    body = spec.to_dict()
    assert body["ports"] == [{"name": "dns", "port": 53, "protocol": "UDP"}]
    assert agentbox.SandboxSpec.from_dict(body).ports == [agentbox.Port("dns", 53, "UDP")]


def _sandbox(phase: str, pod_uid: str | None) -> dict[str, object]:
    ws = {"initializedPodUid": pod_uid} if pod_uid else {}
    return {
        "metadata": {"generation": 1},
        "spec": {},
        "status": {"phase": phase, "observedGeneration": 1, "workspace": ws},
    }


def test_a_sandbox_serves_only_in_the_pod_its_workspace_was_initialised_in() -> None:
    pod = {"metadata": {"uid": "p1"}}
    assert serving(_sandbox("Ready", "p1"), pod)
    assert not serving(_sandbox("Ready", "p0"), pod)  # status from the pod just deleted
    assert not serving(_sandbox("Ready", "p1"), None)
    assert not serving(
        _sandbox("Ready", "p1"), {"metadata": {"uid": "p1", "deletionTimestamp": "t"}}
    )
    assert not serving(_sandbox("Pending", "p1"), pod)
