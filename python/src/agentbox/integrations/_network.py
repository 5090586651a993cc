"""The sandbox's network as the framework backends take it, checked before any request.

The API server checks ``spec.network`` too (the CRD's schema and rules), but only when a
Sandbox is created: a framework's backend is configured long before that, and a typo there
should fail where it is made. These checks are the CRD's rules, in its words.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, cast

from ..errors import InvalidRequestError
from ..spec import EgressAllow, EgressCredential, EgressPort, Network, SandboxSpec

#: The egress policies (the strings; Python's ``None`` is "unset": the cluster's default).
EGRESS = ("None", "All", "Allowlist")
PROTOCOLS = ("TCP", "UDP", "SCTP")
#: The CRD's bounds: allow entries, ports per entry, characters of a CIDR.
MAX_ALLOW = 64
MAX_PORTS = 32
MAX_CIDR = 64
#: The CRD's bound on a domain entry's characters, and its pattern: a lower-case DNS name with
#: at least one dot, optionally ``*.`` first, and not ending in a number (an address).
MAX_DOMAIN = 253
_DOMAIN = re.compile(
    r"^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
)
_NUMERIC_END = re.compile(r"[.][0-9]+$")
#: A credential's Secret name (a Kubernetes object name: a DNS-1123 subdomain) and key (a
#: Secret data key), both at most 253 characters, and its header (an HTTP token of at most 64
#: characters, not one the egress proxy owns).
MAX_NAME = 253
MAX_HEADER = 64
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_HEADER = re.compile(r"^[-!#$%&'*+.^_`|~0-9a-zA-Z]+$")
_PROXY_HEADERS = (
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
)


def network_of(value: Network | Mapping[str, Any] | None) -> Network | None:
    """The network an option gives (pure): ``None`` (the cluster's default) as it is, a
    :class:`~agentbox.Network` checked, or its dict form — a Sandbox's ``spec.network``, such
    as ``{"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443}]}]}``
    or ``{"egress": "Allowlist", "allow": [{"domain": "pypi.org", "ports": [{"port": 443}]}]}``
    (a name reached through agentbox's egress proxy), whose exact domains may carry a
    credential the proxy adds at the hop (``"credential": {"secretName": "model-key", "key":
    "token", "header": "Authorization"}``) — read and checked. A bad value raises
    :class:`~agentbox.errors.InvalidRequestError` (a ``ValueError``) that names it.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = _read(value)
    elif not isinstance(value, Network):
        raise InvalidRequestError(
            f"network must be an agentbox.Network or its dict form, not {type(value).__name__}"
        )
    check_network(value)
    return value


def network_json(network: Network) -> dict[str, Any]:
    """The dict form of a network (a Sandbox's ``spec.network``; ``{}`` when nothing is set)."""
    out = SandboxSpec(network=network).to_dict().get("network", {})
    assert isinstance(out, dict)
    return out


def check_spec_network(spec: SandboxSpec) -> None:
    """Checks a spec's network (pure): its values, and that a spec made from a template sets
    none (the template's applies; the API server refuses one).
    """
    network = spec.network
    if network is None:
        return
    if not isinstance(network, Network):
        raise InvalidRequestError(
            f"spec.network must be an agentbox.Network, not {type(network).__name__}"
        )
    check_network(network)
    if spec.template_ref is not None and network_json(network):
        raise InvalidRequestError(
            "network comes from the template: a spec with template_ref cannot set it "
            "(set network.egress in the SandboxTemplate)"
        )


def check_network(network: Network) -> None:
    """Refuses, naming the cause, what the CRD's rules would refuse (pure)."""
    egress, allow = network.egress, network.allow
    if egress is not None and egress not in EGRESS:
        raise InvalidRequestError(
            f"network.egress must be 'None', 'All' or 'Allowlist' (or unset: the cluster's "
            f"default), not {egress!r}"
        )
    if not isinstance(allow, list):
        raise InvalidRequestError(
            f"network.allow must be a list of EgressAllow, not {type(allow).__name__}"
        )
    if allow and egress != "Allowlist":
        raise InvalidRequestError("network.allow applies only with egress: Allowlist")
    if egress == "Allowlist" and not allow:
        raise InvalidRequestError("egress: Allowlist needs at least one network.allow entry")
    if len(allow) > MAX_ALLOW:
        raise InvalidRequestError(
            f"network.allow has {len(allow)} entries; at most {MAX_ALLOW} are allowed"
        )
    for i, entry in enumerate(allow):
        where = f"network.allow[{i}]"
        if not isinstance(entry, EgressAllow):
            raise InvalidRequestError(f"{where} must be an EgressAllow, not {type(entry).__name__}")
        _check_destination(entry, where)
        if not isinstance(entry.ports, list):
            raise InvalidRequestError(
                f"{where}.ports must be a list of EgressPort, not {type(entry.ports).__name__}"
            )
        if len(entry.ports) > MAX_PORTS:
            raise InvalidRequestError(
                f"{where}.ports has {len(entry.ports)} entries; at most {MAX_PORTS} are allowed"
            )
        if entry.credential is not None:
            _check_credential(entry, where)
        for j, port in enumerate(entry.ports):
            _check_port(port, f"{where}.ports[{j}]")
            if entry.domain is not None and port.protocol != "TCP":
                raise InvalidRequestError(
                    f"{where}.ports[{j}]: the ports of a domain entry are TCP (the egress proxy "
                    f"carries HTTP and TLS over TCP only), not {port.protocol}"
                )


def _check_destination(entry: EgressAllow, where: str) -> None:
    """Exactly one of ``cidr`` and ``domain``, each in the CRD's form."""
    if entry.cidr is not None and entry.domain is not None:
        raise InvalidRequestError(f"{where} has either cidr or domain, not both: write two entries")
    if entry.domain is None:
        _check_cidr(entry.cidr, where)
        return
    domain = entry.domain
    if (
        not isinstance(domain, str)
        or len(domain) > MAX_DOMAIN
        or not _DOMAIN.match(domain)
        or "." not in domain
        or _NUMERIC_END.search(domain)
    ):
        raise InvalidRequestError(
            f"{where}.domain must be a lower-case DNS name with at least one dot, optionally "
            f"starting with '*.' (such as pypi.org or *.github.com), not {domain!r}; "
            f"addresses go in cidr"
        )


def _check_credential(entry: EgressAllow, where: str) -> None:
    """A credential goes on an exact domain, and names a Secret key and a header the proxy may
    set (the CRD's rules, in its words). Whether the Secret allows the domain is the
    operator's to check (condition ``CredentialRefused``): only the cluster knows the Secret.
    """
    cred = entry.credential
    where = f"{where}.credential"
    if not isinstance(cred, EgressCredential):
        raise InvalidRequestError(f"{where} must be an EgressCredential, not {type(cred).__name__}")
    if entry.domain is None or entry.domain.startswith("*."):
        raise InvalidRequestError(
            f"{where}: a credential goes with an exact domain (such as api.example.com), not "
            f"a cidr or a '*.' wildcard: a wildcard would send the key to every name below it"
        )
    name = cred.secret_name
    if not isinstance(name, str) or len(name) > MAX_NAME or not _OBJECT_NAME.match(name):
        raise InvalidRequestError(
            f"{where}.secret_name must be a Kubernetes object name: lowercase letters, digits, "
            f"'-' and '.', starting and ending with a letter or digit, not {name!r}"
        )
    key = cred.key
    if (
        not isinstance(key, str)
        or len(key) > MAX_NAME
        or key in (".", "..")
        or not _DATA_KEY.match(key)
    ):
        raise InvalidRequestError(
            f"{where}.key must be a Secret key: letters, digits, '-', '_' and '.', not {key!r}"
        )
    header = cred.header
    if header is not None and (
        not isinstance(header, str)
        or len(header) > MAX_HEADER
        or not _HEADER.match(header)
        or header.lower() in _PROXY_HEADERS
        or header.lower().startswith("proxy-")
    ):
        raise InvalidRequestError(
            f"{where}.header must be an HTTP header name that is not Host, Connection, "
            f"Content-Length, Transfer-Encoding, Keep-Alive, Upgrade, TE, Trailer or Proxy-*, "
            f"not {header!r}"
        )


def _check_cidr(cidr: object, where: str) -> None:
    if cidr is None:
        raise InvalidRequestError(
            f"{where} needs cidr (an address block such as 10.0.0.0/8) or domain (a name such "
            f"as pypi.org or *.github.com)"
        )
    bad = InvalidRequestError(
        f"{where}.cidr must be an address block in CIDR notation, such as 10.0.0.0/8 or "
        f"192.0.2.7/32, not {cidr!r}"
    )
    if not isinstance(cidr, str) or len(cidr) > MAX_CIDR or "%" in cidr:
        raise bad
    # As the API server reads it: a prefix length is required, in plain decimal (no netmask,
    # no leading zero); host bits may be set.
    _, slash, bits = cidr.partition("/")
    if not slash or not bits.isascii() or not bits.isdigit() or (len(bits) > 1 and bits[0] == "0"):
        raise bad
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError as e:
        raise bad from e


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _check_port(port: object, where: str) -> None:
    if not isinstance(port, EgressPort):
        raise InvalidRequestError(f"{where} must be an EgressPort, not {type(port).__name__}")
    if not _is_port(port.port):
        raise InvalidRequestError(
            f"{where}.port must be a number from 1 to 65535, not {port.port!r}"
        )
    if port.end_port is not None:
        if not _is_port(port.end_port):
            raise InvalidRequestError(
                f"{where}.end_port must be a number from 1 to 65535, not {port.end_port!r}"
            )
        if port.end_port < port.port:
            raise InvalidRequestError(
                f"{where}: end_port ({port.end_port}) must not be below port ({port.port})"
            )
    if port.protocol not in PROTOCOLS:
        raise InvalidRequestError(
            f"{where}.protocol must be TCP, UDP or SCTP, not {port.protocol!r}"
        )


def _keys(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    # A misspelt key (``end_port`` for ``endPort``) would otherwise be dropped in silence.
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise InvalidRequestError(
            f"{where} has unknown field(s) {', '.join(unknown)} (known: {', '.join(known)})"
        )


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(f"{where} must be a list, not {type(value).__name__}")
    return value


def _read(data: Mapping[str, Any]) -> Network:
    """A network from its dict form (camelCase, as in a Sandbox's ``spec.network``)."""
    _keys(data, ("egress", "allow"), "network")
    allow: list[EgressAllow] = []
    for i, entry in enumerate(_list(data.get("allow"), "network.allow")):
        where = f"network.allow[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidRequestError(f"{where} must be a mapping, not {type(entry).__name__}")
        _keys(entry, ("cidr", "domain", "ports", "credential"), where)
        ports: list[EgressPort] = []
        for j, port in enumerate(_list(entry.get("ports"), f"{where}.ports")):
            pw = f"{where}.ports[{j}]"
            if not isinstance(port, Mapping):
                raise InvalidRequestError(f"{pw} must be a mapping, not {type(port).__name__}")
            _keys(port, ("port", "endPort", "protocol"), pw)
            ports.append(
                EgressPort(
                    # Checked below with the rest (a missing port is named there).
                    port=cast(int, port.get("port")),
                    end_port=port.get("endPort"),
                    protocol=port.get("protocol", "TCP"),
                )
            )
        allow.append(
            EgressAllow(
                cidr=entry.get("cidr"),
                ports=ports,
                domain=entry.get("domain"),
                credential=_read_credential(entry.get("credential"), f"{where}.credential"),
            )
        )
    return Network(egress=data.get("egress"), allow=allow)


def _read_credential(data: Any, where: str) -> EgressCredential | None:
    """A credential from its dict form (``secretName``, ``key``, ``header``); checked with its
    entry.
    """
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidRequestError(f"{where} must be a mapping, not {type(data).__name__}")
    _keys(data, ("secretName", "key", "header"), where)
    return EgressCredential(
        # Checked with the entry (a missing name or key is named there).
        secret_name=cast(str, data.get("secretName")),
        key=cast(str, data.get("key")),
        header=data.get("header"),
    )
