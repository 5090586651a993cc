//! Domain entries of an allowlist and the egress proxy that serves them (issue 46): a
//! `domain` entry reaches its name only through agentbox's egress proxy, so an operator run
//! without one (`--egress-proxy-url` empty) leaves such entries closed. That is the safe way
//! to fail (nothing is let out that was not asked for), but a silent one: the sandbox author
//! sees Ready and an allowlist that "allows" `pypi.org`. The [`CONDITION`] condition says it
//! on the Sandbox, with a Warning Event when it turns False, so the author learns why the
//! name is unreachable without reading the operator's configuration. Egress stays closed
//! for those entries either way: this module only reports, it opens nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::conditions;
use super::context::Note;
use super::proxy::EgressProxy;
use agentbox_api::crd::{Egress, Network};

/// Condition type on a Sandbox whose allowlist in force has `domain` entries: whether they
/// are served (by the egress proxy) or closed (no proxy configured).
pub const CONDITION: &str = "DomainEgress";

/// Why [`CONDITION`] is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainEgressReason {
    /// The operator has an egress proxy: the domain entries go through it.
    ThroughProxy,
    /// The operator has no egress proxy: the domain entries reach nothing (egress stays
    /// closed for them).
    NoEgressProxy,
}

impl DomainEgressReason {
    /// The CamelCase reason of the condition and Event.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainEgressReason::ThroughProxy => "ThroughProxy",
            DomainEgressReason::NoEgressProxy => "NoEgressProxy",
        }
    }
}

/// What [`decide`] says of a sandbox's domain entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The condition's status: the entries are served.
    pub served: bool,
    /// Why.
    pub reason: DomainEgressReason,
    /// The condition's (and a Warning Event's) message.
    pub message: String,
}

/// The verdict on `network` (a sandbox's resolved spec's) with egress `default` when the
/// spec sets none and `proxy` configured or not (pure). `None` when its egress in force is
/// not `Allowlist` or the allowlist has no `domain` entry: the condition does not apply
/// (and is removed).
pub fn decide(
    network: &Network,
    default: Egress,
    proxy: Option<&EgressProxy<'_>>,
) -> Option<Verdict> {
    if network.egress_or(default) != Egress::Allowlist {
        return None;
    }
    let domains: Vec<&str> = network
        .allow
        .iter()
        .filter_map(|a| a.domain.as_deref())
        .collect();
    if domains.is_empty() {
        return None;
    }
    let list = domains.join(", ");
    Some(match proxy {
        Some(p) => Verdict {
            served: true,
            reason: DomainEgressReason::ThroughProxy,
            message: format!(
                "domain entries ({list}) are reached through the egress proxy {}",
                p.url
            ),
        },
        None => Verdict {
            served: false,
            reason: DomainEgressReason::NoEgressProxy,
            message: format!(
                "domain entries ({list}) cannot be reached: this operator has no egress proxy (--egress-proxy-url; the chart's egressProxy.enabled), so egress stays closed for them; cidr entries are unaffected"
            ),
        },
    })
}

/// Whether a Warning Event goes out: the verdict is False and the condition was not already
/// False for the same reason (one Event per change, not one per reconcile).
pub fn warn(old: Option<&Condition>, verdict: &Verdict) -> bool {
    !verdict.served
        && !old.is_some_and(|c| c.status == "False" && c.reason == verdict.reason.as_str())
}

/// Sets (or removes) [`CONDITION`] in `conditions` from the verdict on `network`; the
/// Warning Event to publish when it turned False. `old` is the status before this reconcile.
pub fn apply(
    network: &Network,
    default: Egress,
    proxy: Option<&EgressProxy<'_>>,
    old: &[Condition],
    conditions: &mut Vec<Condition>,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Note> {
    let Some(v) = decide(network, default, proxy) else {
        conditions::remove(conditions, CONDITION);
        return None;
    };
    let note = warn(conditions::get(old, CONDITION), &v).then(|| {
        Note::new(
            EventType::Warning,
            v.reason.as_str(),
            "ConfigureEgress",
            &v.message,
        )
    });
    conditions::set(
        conditions,
        CONDITION,
        v.served,
        v.reason.as_str(),
        v.message,
        generation,
        now,
    );
    note
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use serde_json::json;

    fn net(v: serde_json::Value) -> Network {
        serde_json::from_value(v).unwrap()
    }

    fn with_proxy<T>(f: impl FnOnce(&EgressProxy<'_>) -> T) -> T {
        let selector = BTreeMap::from([("app".to_string(), "p".to_string())]);
        f(&EgressProxy {
            url: "http://proxy.ns.svc:3128",
            namespace: "ns",
            selector: &selector,
            port: 3128,
        })
    }

    fn domains() -> Network {
        net(json!({"egress": "Allowlist", "allow": [
            {"domain": "pypi.org", "ports": [{"port": 443}]},
            {"domain": "*.github.com"},
            {"cidr": "10.0.0.0/8"}]}))
    }

    #[test]
    fn domain_entries_without_a_proxy_are_closed_and_said_so() {
        let v = decide(&domains(), Egress::Denied, None).unwrap();
        assert!(!v.served);
        assert_eq!(v.reason.as_str(), "NoEgressProxy");
        assert!(
            v.message.contains("pypi.org, *.github.com") && v.message.contains("stays closed"),
            "{}",
            v.message
        );
    }

    #[test]
    fn domain_entries_with_a_proxy_are_served_through_it() {
        let v = with_proxy(|p| decide(&domains(), Egress::Denied, Some(p))).unwrap();
        assert!(v.served);
        assert_eq!(v.reason, DomainEgressReason::ThroughProxy);
        assert!(
            v.message.contains("http://proxy.ns.svc:3128"),
            "{}",
            v.message
        );
    }

    #[test]
    fn no_condition_without_domain_entries_or_an_allowlist_in_force() {
        let cidr_only = net(json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8"}]}));
        assert_eq!(decide(&cidr_only, Egress::Denied, None), None);
        let all = net(json!({"egress": "All", "allow": [{"domain": "pypi.org"}]}));
        assert_eq!(
            decide(&all, Egress::Denied, None),
            None,
            "All needs no proxy"
        );
        let none = net(json!({"egress": "None", "allow": [{"domain": "pypi.org"}]}));
        assert_eq!(decide(&none, Egress::Denied, None), None);
        // No egress in the spec: the operator's default decides (All here).
        let unset = net(json!({"allow": [{"domain": "pypi.org"}]}));
        assert_eq!(decide(&unset, Egress::All, None), None);
    }

    #[test]
    fn the_event_goes_out_once_per_turn_to_false() {
        let now = Timestamp::UNIX_EPOCH;
        let mut st = Vec::new();
        let note = apply(&domains(), Egress::Denied, None, &[], &mut st, Some(1), now);
        let note = note.expect("a Warning Event when it turns False");
        assert_eq!(note.reason, "NoEgressProxy");
        assert_eq!(st.len(), 1);
        assert_eq!(
            (st[0].status.as_str(), st[0].reason.as_str()),
            ("False", "NoEgressProxy")
        );
        // The next reconcile, the condition already False: no second Event.
        let old = st.clone();
        let again = apply(
            &domains(),
            Egress::Denied,
            None,
            &old,
            &mut st,
            Some(1),
            now,
        );
        assert!(again.is_none());
        // A proxy configured (the operator restarted with one): True, no Event.
        let old = st.clone();
        let served = with_proxy(|p| {
            apply(
                &domains(),
                Egress::Denied,
                Some(p),
                &old,
                &mut st,
                Some(1),
                now,
            )
        });
        assert!(served.is_none());
        assert_eq!(st[0].status, "True");
        // The domain entries edited away: the condition goes.
        let old = st.clone();
        let cidr_only = net(json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8"}]}));
        assert!(
            apply(
                &cidr_only,
                Egress::Denied,
                None,
                &old,
                &mut st,
                Some(2),
                now
            )
            .is_none()
        );
        assert!(st.is_empty());
    }
}
