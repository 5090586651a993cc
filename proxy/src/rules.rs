//! What the proxy allows, as pure functions: the table the operator writes (which pod IP is
//! which sandbox, and its allowlist), matching a host name against domain entries (exact and
//! `*.` wildcards), and the address classes a resolved name may not lead to unless one of
//! the sandbox's address-block entries allows it.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::credential::Credential;

/// The proxy's whole view of the cluster, written by the operator from its own watch of
/// Sandboxes and their pods: one entry per sandbox pod with an IP and an allowlist.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// The sandboxes' pods, by pod IP.
    pub sandboxes: Vec<SandboxEntry>,
}

/// One sandbox pod: who it is and what it may reach.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SandboxEntry {
    /// The pod's IP: a connection from it is this sandbox's (the pod network is the only
    /// witness; nothing the sandbox sends names it).
    pub ip: IpAddr,
    /// The Sandbox's namespace.
    pub namespace: String,
    /// The Sandbox's name.
    pub name: String,
    /// Its allowlist: the `network.allow` entries in force.
    pub allow: Vec<Allow>,
}

/// One allowlist entry: a domain (exact or `*.` wildcard) or an address block, and ports.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Allow {
    /// A lower-case DNS name, or `*.` and one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// An address block (CIDR notation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// Allowed TCP port ranges (inclusive); empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<(u16, u16)>,
    /// A header the proxy adds to plain HTTP requests for this (exact) domain, sent over
    /// TLS it opens itself ([`crate::credential`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Credential>,
}

/// The table indexed for lookups by source address.
#[derive(Debug, Default)]
pub struct Index {
    by_ip: HashMap<IpAddr, Sandbox>,
}

/// A sandbox as the proxy checks it: its allowlist parsed once.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    domains: Vec<(Domain, Vec<(u16, u16)>)>,
    blocks: Vec<(IpNet, Vec<(u16, u16)>)>,
    /// Exact names with a credential, their ports and the credential.
    credentials: Vec<(String, PortRanges, Credential)>,
}

/// Inclusive TCP port ranges; empty: every port.
type PortRanges = Vec<(u16, u16)>;

/// A parsed domain entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Domain {
    /// Exactly this name.
    Exact(String),
    /// Any name strictly below this one (the entry `*.example.com` holds `example.com`).
    Below(String),
}

impl Index {
    /// Indexes `table`; entries that cannot be parsed (which the API server's validation
    /// keeps out) are skipped, so they allow nothing.
    pub fn new(table: &Table) -> Index {
        let by_ip = table
            .sandboxes
            .iter()
            .map(|s| {
                let mut sbx = Sandbox {
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    domains: Vec::new(),
                    blocks: Vec::new(),
                    credentials: Vec::new(),
                };
                for a in &s.allow {
                    if let Some(d) = a.domain.as_deref() {
                        let d = d.trim_end_matches('.').to_ascii_lowercase();
                        let parsed = match d.strip_prefix("*.") {
                            Some(rest) if !rest.is_empty() => Domain::Below(rest.to_string()),
                            Some(_) => continue,
                            None if d.is_empty() => continue,
                            None => Domain::Exact(d),
                        };
                        // A credential holds only for an exact name (the API server's rule
                        // too); on a wildcard it is dropped, and the entry allows nothing.
                        match (&parsed, &a.credential) {
                            (Domain::Exact(n), Some(c)) => {
                                sbx.credentials
                                    .push((n.clone(), a.ports.clone(), c.clone()));
                                continue;
                            }
                            (Domain::Below(_), Some(_)) => continue,
                            _ => {}
                        }
                        sbx.domains.push((parsed, a.ports.clone()));
                    }
                    if let Some(net) = a.cidr.as_deref().and_then(|c| c.parse::<IpNet>().ok()) {
                        sbx.blocks.push((net.trunc(), a.ports.clone()));
                    }
                }
                (s.ip, sbx)
            })
            .collect();
        Index { by_ip }
    }

    /// The sandbox whose pod has address `ip`, if any.
    pub fn sandbox(&self, ip: IpAddr) -> Option<&Sandbox> {
        self.by_ip.get(&canonical(ip))
    }

    /// How many sandboxes the table holds.
    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    /// Whether the table holds no sandbox.
    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }
}

/// An IPv4 address seen as an IPv4-mapped IPv6 one (a dual-stack listener) is the IPv4 one.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why a connection is refused: the log line's and the metric's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The source address is no sandbox's pod (or a sandbox without an allowlist).
    UnknownSource,
    /// The name is not in the sandbox's allowlist (or not on that port).
    NotAllowed,
    /// The request named an address, not a name.
    BareAddress,
    /// The request was no proxy request the proxy understands.
    BadRequest(&'static str),
    /// The TLS server name and the CONNECT target disagree (or there is none).
    ServerNameMismatch,
    /// The Host header and the request's target disagree.
    HostMismatch,
    /// The name resolved only to addresses of a refused class.
    Address(AddressClass),
    /// The name did not resolve.
    Unresolved,
    /// The sandbox has its maximum of open connections.
    SandboxLimit,
    /// The proxy has its maximum of open connections.
    ProxyLimit,
    /// The client did not send its request (or ClientHello) in time.
    Timeout,
    /// The upstream connection failed.
    Upstream,
    /// A CONNECT to a name whose credential the proxy adds: only plain HTTP requests to it
    /// are taken (the proxy opens the TLS itself).
    CredentialTunnel,
    /// The name's credential in the table cannot be sent (a bad header name or value).
    CredentialUnusable,
    /// The server of a credentialed name failed TLS verification (or the handshake).
    UpstreamUnverified,
}

impl Refusal {
    /// A short machine-readable reason (metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::UnknownSource => "unknown_source",
            Refusal::NotAllowed => "not_allowed",
            Refusal::BareAddress => "bare_address",
            Refusal::BadRequest(_) => "bad_request",
            Refusal::ServerNameMismatch => "server_name_mismatch",
            Refusal::HostMismatch => "host_mismatch",
            Refusal::Address(_) => "refused_address",
            Refusal::Unresolved => "unresolved",
            Refusal::SandboxLimit => "sandbox_limit",
            Refusal::ProxyLimit => "proxy_limit",
            Refusal::Timeout => "timeout",
            Refusal::Upstream => "upstream",
            Refusal::CredentialTunnel => "credential_tunnel",
            Refusal::CredentialUnusable => "credential_unusable",
            Refusal::UpstreamUnverified => "upstream_unverified",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UnknownSource => f.write_str("the source is not a sandbox with an allowlist"),
            Refusal::NotAllowed => f.write_str("not in the sandbox's allowlist"),
            Refusal::BareAddress => {
                f.write_str("a bare address: name a domain (addresses go in a cidr entry)")
            }
            Refusal::BadRequest(why) => write!(f, "bad request: {why}"),
            Refusal::ServerNameMismatch => f.write_str(
                "the TLS server name (SNI) is missing or differs from the CONNECT target",
            ),
            Refusal::HostMismatch => {
                f.write_str("the Host header differs from the request's target")
            }
            Refusal::Address(c) => write!(f, "the name resolves to a {c} address"),
            Refusal::Unresolved => f.write_str("the name does not resolve"),
            Refusal::SandboxLimit => f.write_str("the sandbox has its maximum of open connections"),
            Refusal::ProxyLimit => f.write_str("the proxy has its maximum of open connections"),
            Refusal::Timeout => f.write_str("the request did not arrive in time"),
            Refusal::Upstream => f.write_str("the destination did not accept the connection"),
            Refusal::CredentialTunnel => f.write_str(
                "the proxy adds this name's credential itself: send plain http:// requests (the proxy speaks TLS to the server), not CONNECT",
            ),
            Refusal::CredentialUnusable => {
                f.write_str("this name's credential cannot be sent (bad header name or value)")
            }
            Refusal::UpstreamUnverified => f.write_str(
                "the server's TLS certificate did not verify for this name (or the handshake failed)",
            ),
        }
    }
}

/// The classes of addresses a name may not resolve to unless allowed by an address block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// 0.0.0.0/8, `::`.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// RFC 1918 and unique-local IPv6 (fc00::/7).
    Private,
    /// 100.64.0.0/10 (carrier-grade NAT, often a cluster's own).
    Shared,
    /// 169.254.0.0/16 and fe80::/10 (with the cloud metadata address 169.254.169.254).
    LinkLocal,
    /// Multicast and broadcast.
    Multicast,
    /// 240.0.0.0/4 and other reserved blocks.
    Reserved,
    /// An address block the administrator named as the cluster's (pods, services, nodes).
    Cluster,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Unspecified => "unspecified",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::Shared => "shared (100.64.0.0/10)",
            AddressClass::LinkLocal => "link-local (or metadata)",
            AddressClass::Multicast => "multicast",
            AddressClass::Reserved => "reserved",
            AddressClass::Cluster => "cluster",
        })
    }
}

/// The class of `ip` that a name may not lead to, `None` for a public address.
pub fn address_class(ip: IpAddr) -> Option<AddressClass> {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<AddressClass> {
    let o = ip.octets();
    if o[0] == 0 {
        Some(AddressClass::Unspecified)
    } else if ip.is_loopback() {
        Some(AddressClass::Loopback)
    } else if ip.is_private() {
        Some(AddressClass::Private)
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some(AddressClass::Shared)
    } else if ip.is_link_local() {
        Some(AddressClass::LinkLocal)
    } else if ip.is_multicast() || ip.is_broadcast() {
        Some(AddressClass::Multicast)
    } else if o[0] >= 240
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
    {
        // 240/4, IETF protocol assignments (192.0.0.0/24), benchmarking (198.18.0.0/15).
        Some(AddressClass::Reserved)
    } else {
        None
    }
}

fn v6_class(ip: Ipv6Addr) -> Option<AddressClass> {
    let s = ip.segments();
    if ip.is_unspecified() {
        Some(AddressClass::Unspecified)
    } else if ip.is_loopback() {
        Some(AddressClass::Loopback)
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some(AddressClass::Private)
    } else if (s[0] & 0xffc0) == 0xfe80 {
        Some(AddressClass::LinkLocal)
    } else if ip.is_multicast() {
        Some(AddressClass::Multicast)
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        // NAT64 (64:ff9b::/96): the embedded IPv4 address decides.
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        v4_class(Ipv4Addr::new(a, b, c, d))
    } else if s[0] == 0 || s[0] == 0x2002 || (s[0] == 0x2001 && s[1] == 0) {
        // IPv4-compatible and other embeddings (::/8 rest, 6to4, Teredo) can lead anywhere.
        Some(AddressClass::Reserved)
    } else {
        None
    }
}

/// The proxy's own settings for addresses: blocks that are the cluster's (always refused
/// unless a sandbox's own block entry allows them) and blocks the administrator declares
/// reachable by domain entries although their class would refuse them (an internal mirror).
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    /// The cluster's pod, service and node blocks.
    pub cluster: Vec<IpNet>,
    /// Blocks reachable by name although private (administrator's choice).
    pub permitted: Vec<IpNet>,
}

/// Normalises a host from a request or a TLS server name: lower case, no trailing dot, and
/// no port. Refuses addresses (`BareAddress`) and what is no DNS name.
pub fn host_name(raw: &str) -> Result<String, Refusal> {
    let h = raw.trim_end_matches('.').to_ascii_lowercase();
    let bracketed = h.starts_with('[');
    if bracketed || h.parse::<IpAddr>().is_ok() {
        return Err(Refusal::BareAddress);
    }
    let valid = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(Refusal::BadRequest("the host is not a DNS name"));
    }
    // A numeric last label is an address in another spelling (1.2.3.4., 127.1, a.0x10):
    // resolvers read those as addresses, and no top-level domain is numeric.
    if h.rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x"))
    {
        return Err(Refusal::BareAddress);
    }
    Ok(h)
}

/// Splits an authority (`host:port`, `[v6]:port`, or `host` with `default` port).
pub fn split_authority(auth: &str, default: Option<u16>) -> Result<(String, u16), Refusal> {
    let bad = Refusal::BadRequest("the target is not host:port");
    if let Some(rest) = auth.strip_prefix('[') {
        // An IPv6 literal: always a bare address.
        let _ = rest;
        return Err(Refusal::BareAddress);
    }
    match auth.rsplit_once(':') {
        Some((h, p)) => {
            let port = p.parse::<u16>().map_err(|_| bad.clone())?;
            if port == 0 || h.contains(':') {
                return Err(bad);
            }
            Ok((h.to_string(), port))
        }
        None => match default {
            Some(d) => Ok((auth.to_string(), d)),
            None => Err(bad),
        },
    }
}

fn port_in(ports: &[(u16, u16)], port: u16) -> bool {
    ports.is_empty() || ports.iter().any(|(a, b)| (*a..=*b).contains(&port))
}

fn domain_matches(d: &Domain, host: &str) -> bool {
    match d {
        Domain::Exact(name) => name == host,
        Domain::Below(parent) => host
            .strip_suffix(parent.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty()),
    }
}

impl Sandbox {
    /// The credential the proxy adds for exactly `host` (normalised), with its entry's ports:
    /// such a name is reached only by plain HTTP to the proxy and TLS from it, whatever other
    /// entry (a wildcard) would cover it.
    pub fn credential_for(&self, host: &str) -> Option<(&[(u16, u16)], &Credential)> {
        self.credentials
            .iter()
            .find(|(n, _, _)| n == host)
            .map(|(_, ports, c)| (ports.as_slice(), c))
    }

    /// Whether a domain entry allows `host` (normalised) on `port`.
    pub fn allows_name(&self, host: &str, port: u16) -> Result<(), Refusal> {
        if let Some((ports, _)) = self.credential_for(host) {
            return if port_in(ports, port) {
                Ok(())
            } else {
                Err(Refusal::NotAllowed)
            };
        }
        if self
            .domains
            .iter()
            .any(|(d, ports)| domain_matches(d, host) && port_in(ports, port))
        {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }

    /// Whether the proxy may connect to `ip:port` for this sandbox: an address block entry of
    /// its own allows anything it covers; otherwise addresses of a refused class (or the
    /// cluster's) are refused, unless the administrator permitted them.
    pub fn allows_address(
        &self,
        ip: IpAddr,
        port: u16,
        policy: &AddressPolicy,
    ) -> Result<(), Refusal> {
        let ip = canonical(ip);
        if self
            .blocks
            .iter()
            .any(|(net, ports)| net.contains(&ip) && port_in(ports, port))
        {
            return Ok(());
        }
        if policy.permitted.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        if policy.cluster.iter().any(|n| n.contains(&ip)) {
            return Err(Refusal::Address(AddressClass::Cluster));
        }
        match address_class(ip) {
            Some(c) => Err(Refusal::Address(c)),
            None => Ok(()),
        }
    }

    /// The first of `addrs` the proxy may connect to (the one it then connects to: no second
    /// resolution), or the refusal of the first address when none may be used.
    pub fn pick_address(
        &self,
        addrs: &[IpAddr],
        port: u16,
        policy: &AddressPolicy,
    ) -> Result<IpAddr, Refusal> {
        let mut first = None;
        for ip in addrs {
            match self.allows_address(*ip, port, policy) {
                Ok(()) => return Ok(canonical(*ip)),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or(Refusal::Unresolved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(allow: serde_json::Value) -> Sandbox {
        let t: Table = serde_json::from_value(serde_json::json!({"sandboxes": [
            {"ip": "10.244.0.9", "namespace": "ns", "name": "s", "allow": allow}
        ]}))
        .unwrap();
        Index::new(&t)
            .sandbox("10.244.0.9".parse().unwrap())
            .unwrap()
            .clone()
    }

    #[test]
    fn exact_names_match_only_themselves_and_wildcards_only_names_below() {
        let s = sandbox(serde_json::json!([
            {"domain": "pypi.org", "ports": [[443, 443]]},
            {"domain": "*.github.com"}
        ]));
        assert_eq!(s.allows_name("pypi.org", 443), Ok(()));
        assert_eq!(s.allows_name("pypi.org", 80), Err(Refusal::NotAllowed));
        assert_eq!(s.allows_name("www.pypi.org", 443), Err(Refusal::NotAllowed));
        assert_eq!(s.allows_name("evilpypi.org", 443), Err(Refusal::NotAllowed));
        assert_eq!(s.allows_name("api.github.com", 22), Ok(()));
        assert_eq!(s.allows_name("a.b.github.com", 443), Ok(()));
        // The wildcard's parent is not below it, nor is a name that merely ends the same.
        assert_eq!(s.allows_name("github.com", 443), Err(Refusal::NotAllowed));
        assert_eq!(
            s.allows_name("evilgithub.com", 443),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(s.allows_name(".github.com", 443), Err(Refusal::NotAllowed));
    }

    #[test]
    fn hosts_are_normalised_and_addresses_in_any_spelling_are_bare() {
        assert_eq!(host_name("PyPI.org."), Ok("pypi.org".into()));
        for bare in [
            "10.0.0.1",
            "[::1]",
            "::1",
            "1.2.3.4.",
            "127.1",
            "0x7f.0.0.1",
            "a.0x10",
        ] {
            let r = host_name(bare);
            assert!(
                matches!(r, Err(Refusal::BareAddress | Refusal::BadRequest(_))),
                "{bare}: {r:?}"
            );
        }
        assert_eq!(host_name("10.0.0.1"), Err(Refusal::BareAddress));
        assert!(matches!(host_name("a b.com"), Err(Refusal::BadRequest(_))));
        assert!(matches!(host_name("a..com"), Err(Refusal::BadRequest(_))));
        assert!(matches!(host_name(""), Err(Refusal::BadRequest(_))));
    }

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("a.b:443", None), Ok(("a.b".into(), 443)));
        assert_eq!(split_authority("a.b", Some(80)), Ok(("a.b".into(), 80)));
        assert!(split_authority("a.b", None).is_err());
        assert!(split_authority("a.b:0", None).is_err());
        assert!(split_authority("a.b:x", None).is_err());
        assert_eq!(
            split_authority("[::1]:443", None),
            Err(Refusal::BareAddress)
        );
    }

    #[test]
    fn private_loopback_link_local_metadata_and_cluster_addresses_are_refused() {
        let s = sandbox(serde_json::json!([{"domain": "a.example"}]));
        let policy = AddressPolicy {
            cluster: vec![
                "10.96.0.0/12".parse().unwrap(),
                "203.0.113.0/24".parse().unwrap(),
            ],
            permitted: vec![],
        };
        for (ip, class) in [
            ("10.1.2.3", AddressClass::Private),
            ("172.16.0.1", AddressClass::Private),
            ("192.168.1.1", AddressClass::Private),
            ("127.0.0.1", AddressClass::Loopback),
            ("0.0.0.0", AddressClass::Unspecified),
            ("169.254.169.254", AddressClass::LinkLocal),
            ("100.64.0.1", AddressClass::Shared),
            ("224.0.0.1", AddressClass::Multicast),
            ("255.255.255.255", AddressClass::Multicast),
            ("240.0.0.1", AddressClass::Reserved),
            ("::1", AddressClass::Loopback),
            ("::", AddressClass::Unspecified),
            ("fd00::1", AddressClass::Private),
            ("fe80::1", AddressClass::LinkLocal),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("::ffff:169.254.169.254", AddressClass::LinkLocal),
            ("64:ff9b::a9fe:a9fe", AddressClass::LinkLocal),
            ("2002:a00:1::", AddressClass::Reserved),
            ("10.96.0.1", AddressClass::Cluster),
            ("203.0.113.5", AddressClass::Cluster),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let want = if class == AddressClass::Cluster {
                Refusal::Address(AddressClass::Cluster)
            } else {
                Refusal::Address(class)
            };
            assert_eq!(s.allows_address(ip, 443, &policy), Err(want), "{ip}");
        }
        for ip in [
            "93.184.215.14",
            "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
            "8.8.8.8",
        ] {
            assert_eq!(
                s.allows_address(ip.parse().unwrap(), 443, &policy),
                Ok(()),
                "{ip}"
            );
        }
    }

    #[test]
    fn a_sandboxs_own_block_or_the_administrators_permit_allows_a_refused_class() {
        let s = sandbox(serde_json::json!([
            {"domain": "mirror.internal"},
            {"cidr": "10.20.0.0/16", "ports": [[443, 443]]}
        ]));
        let policy = AddressPolicy {
            cluster: vec!["10.20.5.0/24".parse().unwrap()],
            permitted: vec!["192.168.7.0/24".parse().unwrap()],
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(s.allows_address(ip("10.20.1.1"), 443, &policy), Ok(()));
        // Its own block, even inside the cluster's: the sandbox's author asked for it and the
        // NetworkPolicy allows the same address directly.
        assert_eq!(s.allows_address(ip("10.20.5.1"), 443, &policy), Ok(()));
        assert_eq!(
            s.allows_address(ip("10.20.1.1"), 80, &policy),
            Err(Refusal::Address(AddressClass::Private))
        );
        assert_eq!(s.allows_address(ip("192.168.7.9"), 80, &policy), Ok(()));
        assert_eq!(
            s.allows_address(ip("192.168.8.9"), 80, &policy),
            Err(Refusal::Address(AddressClass::Private))
        );
    }

    #[test]
    fn the_first_usable_address_is_picked_and_none_usable_says_why() {
        let s = sandbox(serde_json::json!([{"domain": "a.example"}]));
        let p = AddressPolicy::default();
        let addrs: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "8.8.4.4".parse().unwrap()];
        assert_eq!(
            s.pick_address(&addrs, 443, &p),
            Ok("8.8.4.4".parse().unwrap())
        );
        assert_eq!(
            s.pick_address(&addrs[..1], 443, &p),
            Err(Refusal::Address(AddressClass::Loopback))
        );
        assert_eq!(s.pick_address(&[], 443, &p), Err(Refusal::Unresolved));
    }

    #[test]
    fn sources_are_found_by_pod_ip_including_mapped_ipv4() {
        let t: Table = serde_json::from_value(serde_json::json!({"sandboxes": [
            {"ip": "10.244.0.9", "namespace": "ns", "name": "s", "allow": []}
        ]}))
        .unwrap();
        let i = Index::new(&t);
        assert!(i.sandbox("10.244.0.9".parse().unwrap()).is_some());
        assert!(i.sandbox("::ffff:10.244.0.9".parse().unwrap()).is_some());
        assert!(i.sandbox("10.244.0.10".parse().unwrap()).is_none());
    }
}
