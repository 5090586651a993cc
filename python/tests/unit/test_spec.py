"""The spec dataclasses cover every field of the CRD (read from crds/agentbox.yaml), and
round-trip through their JSON form; scopes are validated with the CRD's rules before any
request."""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

import agentbox
from agentbox.errors import InvalidRequestError
from agentbox.scope import Scope, ScopeKind
from agentbox.spec import SandboxSpec, _camel

CRDS = Path(__file__).resolve().parents[3] / "crds" / "agentbox.yaml"
# Core Kubernetes types, passed through as dicts.
OPAQUE = {"env", "resources", "tolerations", "nodeSelector"}


def _sandbox_spec_schema() -> dict[str, Any]:
    for doc in yaml.safe_load_all(CRDS.read_text()):
        if doc and doc["spec"]["names"]["kind"] == "Sandbox":
            schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema["properties"]["spec"]
    raise AssertionError("no Sandbox CRD")


def _dataclass_of(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(tp):
            found = _dataclass_of(arg)
            if found is not None:
                return found
        return None
    return tp if dataclasses.is_dataclass(tp) else None


def _missing(cls: Any, schema: dict[str, Any], path: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    fields = {_camel(f.name): f.name for f in dataclasses.fields(cls)}
    missing = []
    props = schema.get("properties") or (schema.get("items") or {}).get("properties") or {}
    for key, sub in props.items():
        if key not in fields:
            missing.append(f"{path}.{key}")
            continue
        if key in OPAQUE:
            continue
        nested = _dataclass_of(hints[fields[key]])
        if nested is not None:
            missing += _missing(nested, sub, f"{path}.{key}")
    return missing


def test_every_crd_field_has_a_dataclass_field() -> None:
    assert _missing(SandboxSpec, _sandbox_spec_schema(), "spec") == []


def test_a_full_spec_round_trips_through_json() -> None:
    spec = SandboxSpec(
        image="docker.io/library/busybox:1.37",
        scope=Scope.for_user("coder", "alice@example.com"),
        image_pull_policy="Never",
        command=["sh"],
        args=["-c", "sleep infinity"],
        env={"A": "1"},
        resources={"limits": {"cpu": "1"}},
        runtime_class_name="gvisor",
        node_selector={"disk": "ssd"},
        tolerations=[{"key": "k", "operator": "Exists"}],
        security_context=agentbox.SandboxSecurityContext(
            run_as_user=1000,
            read_only_root_filesystem=True,
            capabilities=agentbox.Capabilities(add=["NET_RAW"], drop=["KILL"]),
        ),
        workspace=agentbox.WorkspaceSpec(
            root="/work",
            files=[
                agentbox.WorkspaceFile("a.sh", content="echo\n", mode=0o755, ephemeral=True),
                agentbox.WorkspaceFile(
                    "b", content_from=agentbox.FileSource(secret_key_ref=agentbox.KeyRef("s", "k"))
                ),
            ],
            projections=[agentbox.Projection("cm", "skills")],
            mounts=[
                agentbox.HostMount("data", "/srv/data", read_only=False, type="DirectoryOrCreate")
            ],
        ),
        snapshot=agentbox.SnapshotPolicy(
            restore="Named",
            name="s1",
            on_stop=True,
            retention=agentbox.Retention(3),
            when_lost="Fail",
        ),
        lifecycle=agentbox.Lifecycle(
            "Suspended", dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
        ),
        network=agentbox.Network("None"),
    )
    d = spec.to_dict()
    assert d["env"] == [{"name": "A", "value": "1"}]
    assert d["workspace"]["files"][0] == {
        "path": "a.sh",
        "content": "echo\n",
        "mode": 493,
        "ephemeral": True,
    }
    assert d["workspace"]["files"][1]["contentFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert d["workspace"]["mounts"][0] == {
        "path": "data",
        "hostPath": "/srv/data",
        "readOnly": False,
        "type": "DirectoryOrCreate",
    }
    assert d["lifecycle"] == {"mode": "Suspended", "shutdownTime": "2030-01-02T03:04:05Z"}
    assert d["scope"] == {"kind": "User", "agent": "coder", "user": "alice@example.com"}
    assert d["snapshot"] == {
        "restore": "Named",
        "name": "s1",
        "onStop": True,
        "retention": {"keepLast": 3},
        "whenLost": "Fail",
    }
    assert d["securityContext"]["capabilities"] == {"add": ["NET_RAW"], "drop": ["KILL"]}
    back = SandboxSpec.from_dict(d)
    assert back.to_dict() == d
    assert back.security_context is not None
    assert back.security_context.capabilities == agentbox.Capabilities(["NET_RAW"], ["KILL"])
    assert back.workspace.files[1].content_from == agentbox.FileSource(
        secret_key_ref=agentbox.KeyRef("s", "k")
    )
    assert back.scope == spec.scope


def test_a_minimal_spec_leaves_server_defaults_alone() -> None:
    d = SandboxSpec(image="busybox").to_dict()
    assert "env" not in d and "scope" not in d and "nodeSelector" not in d
    assert d["image"] == "busybox"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": ScopeKind.SESSION, "agent": "a"}, "scope.session is required"),
        (
            {"kind": ScopeKind.USER, "agent": "a", "user": "u", "session": "s"},
            "scope.session is not used",
        ),
        ({"kind": ScopeKind.GLOBAL, "agent": "a"}, "scope.agent is not used"),
        ({"kind": ScopeKind.AGENT}, "scope.agent is required"),
        ({"kind": ScopeKind.AGENT, "agent": ""}, "1 to 253"),
        ({"kind": ScopeKind.AGENT, "agent": "x" * 254}, "1 to 253"),
        ({"kind": "Team", "agent": "a"}, "scope.kind must be one of"),
    ],
)
def test_a_bad_scope_is_refused_with_the_crd_rule(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        Scope(**kwargs)


def test_scope_constructors_and_json() -> None:
    assert Scope.for_session("a", "s").to_dict() == {
        "kind": "Session",
        "agent": "a",
        "session": "s",
    }
    assert Scope.for_user("a", "u") == Scope.from_dict({"kind": "User", "agent": "a", "user": "u"})
    assert Scope.for_agent("a").kind is ScopeKind.AGENT
    assert Scope.for_global().to_dict() == {"kind": "Global"}
    assert ScopeKind.SESSION.label_value == "session"


def test_a_spec_from_a_template_names_it_and_leaves_the_pod_to_it() -> None:
    spec = SandboxSpec.from_template(
        "agent",
        env={"TASK": "x"},
        workspace=agentbox.WorkspaceSpec(files=[agentbox.WorkspaceFile("task.md", content="t")]),
    )
    d = spec.to_dict()
    assert d["templateRef"] == {"name": "agent"}
    assert "image" not in d
    assert d["env"] == [{"name": "TASK", "value": "x"}]
    back = SandboxSpec.from_dict(d)
    assert back.template_ref == agentbox.TemplateRef("agent")
    assert back.image is None
    assert back.to_dict() == d


def test_network_is_the_clusters_default_unless_set_and_an_allowlist_round_trips() -> None:
    plain = SandboxSpec(image="busybox", scope=agentbox.Scope.for_global())
    assert "network" not in plain.to_dict(), "unset: the cluster's default (None)"
    spec = SandboxSpec(
        image="busybox",
        scope=agentbox.Scope.for_global(),
        network=agentbox.Network(
            "Allowlist",
            [
                agentbox.EgressAllow(
                    "10.0.0.0/8",
                    [agentbox.EgressPort(443), agentbox.EgressPort(8000, 8010, "UDP")],
                )
            ],
        ),
    )
    d = spec.to_dict()
    assert d["network"] == {
        "egress": "Allowlist",
        "allow": [
            {
                "cidr": "10.0.0.0/8",
                "ports": [
                    {"port": 443, "protocol": "TCP"},
                    {"port": 8000, "endPort": 8010, "protocol": "UDP"},
                ],
            }
        ],
    }
    assert SandboxSpec.from_dict(d).to_dict() == d


def test_a_domain_entry_carries_a_credential_on_the_wire() -> None:
    spec = SandboxSpec(
        image="busybox",
        scope=agentbox.Scope.for_global(),
        network=agentbox.Network(
            "Allowlist",
            [
                agentbox.EgressAllow(
                    domain="api.example.com",
                    ports=[agentbox.EgressPort(443)],
                    credential=agentbox.EgressCredential("model-key", "token"),
                ),
                agentbox.EgressAllow(
                    domain="api.example.org",
                    credential=agentbox.EgressCredential("k", "t", header="X-Api-Key"),
                ),
            ],
        ),
    )
    d = spec.to_dict()
    assert d["network"]["allow"] == [
        {
            "domain": "api.example.com",
            "ports": [{"port": 443, "protocol": "TCP"}],
            "credential": {"secretName": "model-key", "key": "token"},
        },
        {
            "domain": "api.example.org",
            "credential": {"secretName": "k", "key": "t", "header": "X-Api-Key"},
        },
    ]
    back = SandboxSpec.from_dict(d)
    assert back.network.allow[0].credential == agentbox.EgressCredential("model-key", "token")
    assert back.to_dict() == d
