"""Both framework backends take the sandbox's egress (None, All or an allowlist) where they
take its other settings: the spec each sends carries the network as given (and none when it
is unset: the cluster's default), and a bad one is refused, naming its cause, before any
request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions

import agentbox
import agentbox.client
from agentbox import EgressAllow, EgressCredential, EgressPort, Network, SandboxSpec
from agentbox.integrations.agentscope import AgentboxWorkspace, AgentboxWorkspaceManager
from agentbox.integrations.openai_agents import (
    AgentboxSandboxClient,
    AgentboxSandboxClientOptions,
    build_spec,
)

ALLOWLIST = Network(
    "Allowlist",
    [
        EgressAllow("10.96.0.0/12", [EgressPort(443), EgressPort(8000, 8010, "UDP")]),
        EgressAllow("2001:db8::/32"),
    ],
)
ALLOWLIST_JSON = {
    "egress": "Allowlist",
    "allow": [
        {
            "cidr": "10.96.0.0/12",
            "ports": [
                {"port": 443, "protocol": "TCP"},
                {"port": 8000, "endPort": 8010, "protocol": "UDP"},
            ],
        },
        {"cidr": "2001:db8::/32"},
    ],
}
# Domain entries (through agentbox's egress proxy) beside an address block.
DOMAINS = Network(
    "Allowlist",
    [
        EgressAllow(domain="pypi.org", ports=[EgressPort(443)]),
        EgressAllow(domain="*.github.com"),
        EgressAllow("10.96.0.0/12", [EgressPort(53, protocol="UDP")]),
        # A credential the proxy adds at the hop, with its default header and with one named.
        EgressAllow(
            domain="api.openai.com",
            ports=[EgressPort(443)],
            credential=EgressCredential("model-key", "token"),
        ),
        EgressAllow(
            domain="api.example.com",
            credential=EgressCredential("other-key", "api_key.v1", "X-Api-Key"),
        ),
    ],
)
DOMAINS_JSON = {
    "egress": "Allowlist",
    "allow": [
        {"domain": "pypi.org", "ports": [{"port": 443, "protocol": "TCP"}]},
        {"domain": "*.github.com"},
        {"cidr": "10.96.0.0/12", "ports": [{"port": 53, "protocol": "UDP"}]},
        {
            "domain": "api.openai.com",
            "ports": [{"port": 443, "protocol": "TCP"}],
            "credential": {"secretName": "model-key", "key": "token"},
        },
        {
            "domain": "api.example.com",
            "credential": {"secretName": "other-key", "key": "api_key.v1", "header": "X-Api-Key"},
        },
    ],
}
GIVEN = [
    (Network("None"), {"egress": "None"}),
    (Network("All"), {"egress": "All"}),
    (ALLOWLIST, ALLOWLIST_JSON),
    (DOMAINS, DOMAINS_JSON),
]

CRED = {"secretName": "model-key", "key": "token"}

# Each bad network (in its dict form) and the words its refusal must name.
BAD: list[tuple[Any, str]] = [
    ({"egress": "none"}, r"network\.egress must be 'None', 'All' or 'Allowlist'"),
    ({"egress": "Allowlist"}, "Allowlist needs at least one network.allow entry"),
    ({"egress": "All", "allow": [{"cidr": "10.0.0.0/8"}]}, "applies only with egress: Allowlist"),
    ({"allow": [{"cidr": "10.0.0.0/8"}]}, "applies only with egress: Allowlist"),
    (
        {"egress": "Allowlist", "allow": [{"ports": [{"port": 80}]}]},
        r"allow\[0\] needs cidr .* or domain",
    ),
    ({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.1"}]}, r"allow\[0\]\.cidr must be"),
    ({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/33"}]}, "CIDR notation"),
    ({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/255.0.0.0"}]}, "CIDR notation"),
    ({"egress": "Allowlist", "allow": [{"cidr": "example.com/32"}]}, "CIDR notation"),
    (
        {"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 0}]}]},
        r"ports\[0\]\.port must be a number from 1 to 65535, not 0",
    ),
    (
        {"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 65536}]}]},
        "from 1 to 65535",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 90, "endPort": 80}]}],
        },
        r"end_port \(80\) must not be below port \(90\)",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 53, "protocol": "ICMP"}]}],
        },
        "protocol must be TCP, UDP or SCTP",
    ),
    (
        {"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": "443"}]}]},
        "from 1 to 65535, not '443'",
    ),
    (
        {"egress": "Allowlist", "allow": [{"cidr": f"10.0.{i}.0/24"} for i in range(65)]},
        "at most 64",
    ),
    # A misspelt key is named, not dropped (dropped, the policy would widen to every port).
    (
        {"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "port": [{"port": 443}]}]},
        r"unknown field\(s\) port",
    ),
    ({"egres": "None"}, r"unknown field\(s\) egres"),
    # Domain entries: the CRD's rules, in its words.
    (
        {"egress": "Allowlist", "allow": [{"domain": "pypi.org", "cidr": "10.0.0.0/8"}]},
        "either cidr or domain, not both",
    ),
    ({"egress": "Allowlist", "allow": [{"domain": "PyPI.org"}]}, r"allow\[0\]\.domain must be"),
    ({"egress": "Allowlist", "allow": [{"domain": "localhost"}]}, "at least one dot"),
    ({"egress": "Allowlist", "allow": [{"domain": "10.0.0.1"}]}, "addresses go in cidr"),
    ({"egress": "Allowlist", "allow": [{"domain": "a.*.example.com"}]}, "domain must be"),
    ({"egress": "Allowlist", "allow": [{"domain": "x" * 250 + ".com"}]}, "domain must be"),
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "pypi.org", "ports": [{"port": 53, "protocol": "UDP"}]}],
        },
        r"allow\[0\]\.ports\[0\]: the ports of a domain entry are TCP",
    ),
    # Credentials: the CRD's rules, in its words, before any request.
    (
        {"egress": "Allowlist", "allow": [{"domain": "*.openai.com", "credential": CRED}]},
        r"allow\[0\]\.credential: a credential goes with an exact domain .* not a cidr or a "
        r"'\*\.' wildcard",
    ),
    (
        {"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "credential": CRED}]},
        "a credential goes with an exact domain",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "api.openai.com", "credential": {"key": "t"}}],
        },
        r"credential\.secret_name must be a Kubernetes object name.*not None",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "api.openai.com", "credential": {"secretName": "", "key": "t"}}],
        },
        r"secret_name must be a Kubernetes object name.*not ''",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [
                {"domain": "api.openai.com", "credential": {"secretName": "Model_Key", "key": "t"}}
            ],
        },
        "secret_name must be a Kubernetes object name",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "api.openai.com", "credential": {"secretName": "k", "key": ""}}],
        },
        r"credential\.key must be a Secret key.*not ''",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [
                {"domain": "api.openai.com", "credential": {"secretName": "k", "key": "a/b"}}
            ],
        },
        "key must be a Secret key",
    ),
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "api.openai.com", "credential": {"secretName": "k", "key": ".."}}],
        },
        "key must be a Secret key",
    ),
    *[
        (
            {
                "egress": "Allowlist",
                "allow": [
                    {
                        "domain": "api.openai.com",
                        "credential": {"secretName": "k", "key": "t", "header": header},
                    }
                ],
            },
            r"credential\.header must be an HTTP header name",
        )
        for header in ("", "Host", "proxy-authorization", "X Key", "X-Key:", "a" * 65)
    ],
    (
        {
            "egress": "Allowlist",
            "allow": [{"domain": "api.openai.com", "credential": {"secretName": "k", "kee": "t"}}],
        },
        r"credential has unknown field\(s\) kee",
    ),
]


VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "tests" / "vectors" / "protocol.json").read_text()
)
# What each fault of the vectors' credentials is called in the refusal.
FAULT_WORDS = {
    "domain": "a credential goes with an exact domain",
    "secret_name": "credential.secret_name must be",
    "key": "credential.key must be",
    "header": "credential.header must be",
}


@pytest.mark.parametrize("case", VECTORS["credentials"], ids=lambda c: json.dumps(c)[:60])
def test_credentials_are_refused_as_the_crds_rules_refuse_them(case: dict[str, Any]) -> None:
    # The cross-language rule (tests/vectors/protocol.json, from EgressCredential::fault).
    entry = EgressAllow(
        cidr="10.0.0.0/8" if case["domain"] is None else None,
        domain=case["domain"],
        credential=EgressCredential(case["secretName"], case["key"], case["header"]),
    )
    network = Network("Allowlist", [entry])
    if case["fault"] is None:
        AgentboxSandboxClientOptions(image="img", network=network)
    else:
        with pytest.raises(ValueError, match=FAULT_WORDS[case["fault"]]):
            AgentboxSandboxClientOptions(image="img", network=network)


class RefuseAll:
    """An API server that records every request and answers none."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    async def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, path, body))
        raise RuntimeError("stop: the test looks at the request")

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        self.requests.append(("GET", path, None))
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> RefuseAll:
    fake = RefuseAll()
    monkeypatch.setattr(agentbox.client, "Kube", lambda api_client: fake)
    return fake


def posted_network(api: RefuseAll) -> Any:
    (post,) = [r for r in api.requests if r[0] == "POST"]
    return post[2]["spec"].get("network")


# --- openai-agents -------------------------------------------------------------------------


@pytest.mark.parametrize(("network", "wire"), GIVEN)
def test_openai_agents_options_carry_the_network_into_the_spec(
    network: Network, wire: dict[str, Any]
) -> None:
    opts = AgentboxSandboxClientOptions(image="img", network=network)
    assert build_spec(opts, Manifest()).to_dict()["network"] == wire
    # Its dict form is the same network.
    from_dict = AgentboxSandboxClientOptions(image="img", network=wire)
    assert from_dict.network == network
    # Options make JSON round trips in the framework's run state.
    back = BaseSandboxClientOptions.parse(opts.model_dump(mode="json"))
    assert isinstance(back, AgentboxSandboxClientOptions) and back.network == network


def test_openai_agents_options_without_a_network_leave_it_to_the_cluster() -> None:
    opts = AgentboxSandboxClientOptions(image="img")
    assert opts.network is None
    assert "network" not in build_spec(opts, Manifest()).to_dict()
    back = BaseSandboxClientOptions.parse(opts.model_dump(mode="json"))
    assert isinstance(back, AgentboxSandboxClientOptions) and back.network is None


async def test_openai_agents_create_sends_the_network_as_given(api: RefuseAll) -> None:
    client = AgentboxSandboxClient(api_client=object())
    opts = AgentboxSandboxClientOptions(image="img", namespace="agents", network=ALLOWLIST)
    with pytest.raises(RuntimeError, match="stop"):
        await client.create(options=opts)
    assert posted_network(api) == ALLOWLIST_JSON

    api.requests.clear()
    with pytest.raises(RuntimeError, match="stop"):
        await client.create(options=AgentboxSandboxClientOptions(image="img", namespace="a"))
    assert posted_network(api) is None


@pytest.mark.parametrize(("bad", "cause"), BAD)
def test_openai_agents_options_refuse_a_bad_network_naming_it(bad: Any, cause: str) -> None:
    with pytest.raises(ValueError, match=cause):
        AgentboxSandboxClientOptions(image="img", network=bad)


def test_openai_agents_options_refuse_what_is_not_a_network() -> None:
    with pytest.raises(ValueError, match=r"must be an agentbox\.Network or its dict form, not str"):
        AgentboxSandboxClientOptions(image="img", network="None")  # type: ignore[arg-type]
    # The dataclass form is checked as its dict form is.
    bad = Network("Allowlist", [EgressAllow("10.0.0.0/8", [EgressPort(22, 21)])])
    with pytest.raises(ValueError, match="must not be below port"):
        AgentboxSandboxClientOptions(image="img", network=bad)


# --- agentscope ----------------------------------------------------------------------------


@pytest.mark.parametrize(("network", "wire"), GIVEN)
async def test_agentscope_workspace_sends_the_spec_network_as_given(
    api: RefuseAll, network: Network, wire: dict[str, Any]
) -> None:
    ws = AgentboxWorkspace(
        scope=agentbox.Scope.for_user("coder", "alice"),
        spec=SandboxSpec(image="img", network=network),
        namespace="agents",
        api_client=object(),
    )
    with pytest.raises(RuntimeError, match="stop"):
        await ws.initialize()
    assert posted_network(api) == wire


async def test_agentscope_workspace_without_a_network_leaves_it_to_the_cluster(
    api: RefuseAll,
) -> None:
    ws = AgentboxWorkspace(
        scope=agentbox.Scope.for_user("coder", "alice"), namespace="agents", api_client=object()
    )
    with pytest.raises(RuntimeError, match="stop"):
        await ws.initialize()
    assert posted_network(api) is None


async def test_agentscope_manager_hands_its_spec_network_to_every_workspace(
    api: RefuseAll,
) -> None:
    manager = AgentboxWorkspaceManager(
        spec=SandboxSpec(image="img", network=ALLOWLIST), namespace="agents", api_client=object()
    )
    with pytest.raises(RuntimeError, match="stop"):
        await manager.get_workspace("alice", "coder", "s1")
    assert posted_network(api) == ALLOWLIST_JSON


def _from_dict(bad: dict[str, Any]) -> Network:
    # The dataclass form of a bad dict, as a user would build it (no check on the way).
    allow = [
        EgressAllow(
            a.get("cidr"),
            [
                EgressPort(p.get("port"), p.get("endPort"), p.get("protocol", "TCP"))
                for p in a.get("ports", [])
            ],
            a.get("domain"),
            None
            if a.get("credential") is None
            else EgressCredential(
                a["credential"].get("secretName"),
                a["credential"].get("key"),
                a["credential"].get("header"),
            ),
        )
        for a in bad.get("allow", [])
    ]
    return Network(bad.get("egress"), allow)


@pytest.mark.parametrize(("bad", "cause"), [(b, c) for b, c in BAD if "unknown field" not in c])
def test_agentscope_refuses_a_bad_network_before_any_request(
    api: RefuseAll, bad: dict[str, Any], cause: str
) -> None:
    spec = SandboxSpec(image="img", network=_from_dict(bad))
    scope = agentbox.Scope.for_user("coder", "alice")
    with pytest.raises(agentbox.InvalidRequestError, match=cause):
        AgentboxWorkspace(scope=scope, spec=spec, namespace="agents", api_client=object())
    with pytest.raises(agentbox.InvalidRequestError, match=cause):
        AgentboxWorkspaceManager(spec=spec, namespace="agents", api_client=object())
    assert api.requests == []


def test_agentscope_refuses_a_network_on_a_spec_made_from_a_template(api: RefuseAll) -> None:
    spec = SandboxSpec.from_template("python", network=Network("All"))
    with pytest.raises(agentbox.InvalidRequestError, match="network comes from the template"):
        AgentboxWorkspaceManager(spec=spec, namespace="agents", api_client=object())
    # Without one, the template's applies.
    AgentboxWorkspaceManager(
        spec=SandboxSpec.from_template("python"), namespace="agents", api_client=object()
    )
    assert api.requests == []
