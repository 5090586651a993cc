//! The egress proxy's side of the operator (issue 46): the proxy's table (which pod IP is
//! which sandbox, and the allowlist in force for it) built from the operator's own watch of
//! Sandboxes and their pods, and written into every proxy pod through the pod's exec
//! (`agentbox-proxy write-table`), so the proxy needs no API credential and trusts nothing a
//! sandbox sends. Also the proxy's place in a sandbox: its NetworkPolicy peer and the
//! environment that points HTTP clients at it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use k8s_openapi::api::networking::v1::{
    NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{debug, info, warn};

use super::credential::{self, SecretCache, SecretFacts};
use super::credential_status::Reporter;
use agentbox_api::crd::{Egress, Network, Sandbox, SandboxTemplate};
use agentbox_api::labels;
use agentbox_proxy::rules::{Allow, SandboxEntry, Table};

/// The egress proxy as the operator's configuration names it.
#[derive(Debug, Clone, Copy)]
pub struct EgressProxy<'a> {
    /// Its URL as sandboxes reach it (`HTTP_PROXY`).
    pub url: &'a str,
    /// Namespace of its pods.
    pub namespace: &'a str,
    /// Labels of its pods.
    pub selector: &'a BTreeMap<String, String>,
    /// Its pods' TCP port.
    pub port: u16,
}

/// Parses `key=value[,key=value]` (the proxy pods' labels); at least one pair.
pub fn parse_selector(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("selector {s:?}: {pair:?} is not key=value"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    if out.is_empty() {
        return Err(format!("selector {s:?} selects no label"));
    }
    Ok(out)
}

/// The names of the proxy settings a sandbox's environment gets.
pub const PROXY_ENV: [&str; 4] = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"];

/// What a sandbox's container gets with a proxy configured and an egress other than `All`:
/// the proxy for HTTP and HTTPS, and loopback exempt. Names the spec sets itself are left
/// to it (the NetworkPolicy, not the environment, is what confines the sandbox).
pub fn proxy_env(
    proxy: &EgressProxy<'_>,
    network: &Network,
    default: Egress,
    own: &[EnvVar],
) -> Vec<EnvVar> {
    if network.egress_or(default) == Egress::All {
        return Vec::new();
    }
    let no_proxy = "localhost,127.0.0.1,::1";
    PROXY_ENV
        .iter()
        .map(|n| (*n, proxy.url))
        .chain([("NO_PROXY", no_proxy), ("no_proxy", no_proxy)])
        .filter(|(n, _)| !own.iter().any(|e| e.name == *n))
        .map(|(n, v)| EnvVar {
            name: n.to_string(),
            value: Some(v.to_string()),
            value_from: None,
        })
        .collect()
}

/// The NetworkPolicy rule that admits the proxy's pods (their port, TCP) for an allowlist
/// with `domain` entries.
pub fn proxy_rule(proxy: &EgressProxy<'_>) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    proxy.namespace.to_string(),
                )])),
                ..Default::default()
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(proxy.selector.clone()),
                ..Default::default()
            }),
            ip_block: None,
        }]),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(i32::from(proxy.port))),
            end_port: None,
            protocol: Some("TCP".into()),
        }]),
    }
}

/// Where the table's credentials come from: the facts of key `key` of Secret `secret` in
/// namespace `ns` (`None` when it does not exist or was not read).
pub type SecretLookup<'a> = dyn Fn(&str, &str, &str) -> Option<SecretFacts> + 'a;

/// The allowlist entries of `network` as the proxy reads them; `None` unless its egress in
/// force is `Allowlist` with at least one domain entry (other sandboxes are not the proxy's).
/// A credentialed entry is in it with its credential when [`credential::decide`] allows
/// that (the Secret of namespace `ns` lists the domain), and left out otherwise: it then
/// allows nothing, and its key goes nowhere.
pub fn allowlist(
    network: &Network,
    default: Egress,
    ns: &str,
    secrets: &SecretLookup<'_>,
) -> Option<Vec<Allow>> {
    if network.egress_or(default) != Egress::Allowlist
        || !network.allow.iter().any(|a| a.domain.is_some())
    {
        return None;
    }
    Some(
        network
            .allow
            .iter()
            .filter_map(|a| {
                // Only TCP reaches the proxy: an entry whose ports are all UDP or SCTP allows
                // nothing there (and must not become "every port").
                let tcp: Vec<(u16, u16)> = a
                    .ports
                    .iter()
                    .filter(|p| p.protocol.as_str() == "TCP")
                    .map(|p| {
                        let lo = clamp_port(p.port);
                        (lo, p.end_port.map_or(lo, clamp_port).max(lo))
                    })
                    .collect();
                if !a.ports.is_empty() && tcp.is_empty() {
                    return None;
                }
                let credential = match (&a.domain, &a.credential) {
                    (Some(d), Some(c)) => {
                        let facts = secrets(ns, &c.secret_name, &c.key);
                        Some(credential::decide(d, c, facts.as_ref()).ok()?)
                    }
                    _ => None,
                };
                Some(Allow {
                    domain: a.domain.clone(),
                    cidr: a.cidr.clone(),
                    ports: tcp,
                    credential,
                })
            })
            .collect(),
    )
}

fn clamp_port(p: i32) -> u16 {
    u16::try_from(p.clamp(1, 65535)).unwrap_or(u16::MAX)
}

/// The proxy's table (pure): every pod of a sandbox whose allowlist (its own, or its
/// template's) has domain entries, by the pod's IP. A pod counts while it has an IP and has
/// not ended, and only when the sandbox is its controller (a pod's labels can be copied; its
/// owner's UID cannot). Sorted, so equal tables are equal bytes.
pub fn build_table(
    sandboxes: &[Arc<Sandbox>],
    pods: &[Arc<Pod>],
    templates: &[Arc<SandboxTemplate>],
    default: Egress,
    secrets: &SecretLookup<'_>,
) -> Table {
    let by_uid: HashMap<String, &Sandbox> = sandboxes
        .iter()
        .filter_map(|s| Some((s.uid()?, s.as_ref())))
        .collect();
    let mut out = Vec::new();
    for pod in pods {
        let Some(status) = pod.status.as_ref() else {
            continue;
        };
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(ip) = status.pod_ip.as_deref().and_then(|i| i.parse().ok()) else {
            continue;
        };
        let Some(sbx) = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "Sandbox")
            .and_then(|o| by_uid.get(&o.uid))
        else {
            continue;
        };
        if sbx.namespace() != pod.namespace() {
            continue;
        }
        let network = match sbx.spec.template_ref.as_ref() {
            None => sbx.spec.pod.network.clone(),
            Some(t) => match templates
                .iter()
                .find(|x| x.name_any() == t.name && x.namespace() == sbx.namespace())
            {
                Some(tpl) => {
                    agentbox_api::template::resolve(&tpl.spec, &sbx.spec)
                        .pod
                        .network
                }
                // Its template is gone: nothing is allowed through the proxy.
                None => continue,
            },
        };
        let ns = sbx.namespace().unwrap_or_default();
        let Some(allow) = allowlist(&network, default, &ns, secrets) else {
            continue;
        };
        out.push(SandboxEntry {
            ip,
            namespace: ns,
            name: sbx.name_any(),
            allow,
        });
    }
    out.sort_by_key(|a| a.ip);
    Table { sandboxes: out }
}

/// How often the feeder looks whether the table changed.
const TICK: Duration = Duration::from_millis(200);
/// How long one write into a proxy pod may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Keeps every proxy pod's table current until `shutdown`: watches Sandboxes, their pods
/// and the proxy's pods, and writes the table into a proxy pod whenever it differs from what
/// that pod (by UID) last received. The credentials it leaves out go to `reporter` (the
/// sandboxes' `Credentials` condition and Events).
// Eight: what it watches, where it writes, and the reporter; a struct for one caller would
// only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    scope: Api<Sandbox>,
    scope_pods: Api<Pod>,
    templates: Store<SandboxTemplate>,
    proxy: EgressProxy<'_>,
    default: Egress,
    mut reporter: Reporter,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let proxy_pods: Api<Pod> = Api::namespaced(client.clone(), proxy.namespace);
    let mut secrets = SecretCache::new(client);
    let selector = label_selector(proxy.selector);
    let (sbx_store, sbx_watch) = mirror(scope, watcher::Config::default());
    let (pod_store, pod_watch) = mirror(
        scope_pods,
        watcher::Config::default().labels(labels::SANDBOX),
    );
    let (proxy_store, proxy_watch) = mirror(
        proxy_pods.clone(),
        watcher::Config::default().labels(&selector),
    );
    let feed = async {
        let _ = tokio::join!(
            sbx_store.wait_until_ready(),
            pod_store.wait_until_ready(),
            proxy_store.wait_until_ready()
        );
        info!(namespace = proxy.namespace, selector = %selector, "feeding the egress proxy");
        // What each proxy pod (by UID) last received.
        let mut sent: HashMap<String, Vec<u8>> = HashMap::new();
        // The credentials refused last time (see log_refused).
        let mut refused_before: HashMap<String, Vec<String>> = HashMap::new();
        loop {
            let sandboxes = sbx_store.state();
            let tpls = templates.state();
            secrets
                .refresh(&credential_secrets(&sandboxes, &tpls))
                .await;
            let lookup = |ns: &str, name: &str, key: &str| secrets.facts(ns, name, key);
            let table = build_table(&sandboxes, &pod_store.state(), &tpls, default, &lookup);
            let refused = refused_credentials(&sandboxes, &tpls, &lookup);
            log_refused(&sandboxes, &refused, &refused_before);
            match serde_json::to_vec(&table) {
                Ok(bytes) => {
                    let n = table.sandboxes.len();
                    feed_pods(&proxy_pods, &proxy_store.state(), &bytes, n, &mut sent).await;
                }
                Err(e) => warn!("encoding the egress proxy's table: {e}"),
            }
            // After the table: a refused credential leaves the proxy first, then it is said.
            reporter.report(&sandboxes, &refused).await;
            refused_before = refused;
            tokio::time::sleep(TICK).await;
        }
    };
    tokio::select! {
        _ = sbx_watch => {}
        _ = pod_watch => {}
        _ = proxy_watch => {}
        _ = feed => {}
        _ = shutdown => {}
    }
}

/// A cache of the objects `api` and `config` select, and the watch that fills it (to be
/// polled for as long as the cache is read). Slimmed as the sandbox controller's own caches
/// ([`super::cache::slim`]): without it the feed's copy of every Sandbox kept its managed
/// fields, most of a Suspended Sandbox's size (docs/operations.md, "Memory").
fn mirror<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store::<K>();
    let watch = watcher(api, config)
        .default_backoff()
        .modify(super::cache::slim)
        .reflect(writer)
        .applied_objects()
        .for_each(|_| async {});
    (store, watch)
}

/// `key=value,...`: the proxy pods' labels as a list selector.
fn label_selector(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// Logs each credential refused now that was not refused last time (`refused` and `before`
/// by Sandbox UID): a running sandbox's edited allowlist is not checked by the sandbox
/// controller (its entry just allows nothing), and this says why beside the condition.
fn log_refused(
    sandboxes: &[Arc<Sandbox>],
    refused: &HashMap<String, Vec<String>>,
    before: &HashMap<String, Vec<String>>,
) {
    for sbx in sandboxes {
        let Some(uid) = sbx.uid() else { continue };
        let was = before.get(&uid);
        for r in refused.get(&uid).into_iter().flatten() {
            if !was.is_some_and(|w| w.contains(r)) {
                let ns = sbx.namespace().unwrap_or_default();
                warn!(
                    "egress proxy credential left out: {ns}/{}: {r}",
                    sbx.name_any()
                );
            }
        }
    }
}

/// Writes the table `bytes` (of `sandboxes` sandboxes) into each of the `live` proxy pods
/// ready for it that did not receive these bytes last (`sent`, by pod UID, forgets the pods
/// gone).
async fn feed_pods(
    proxy_pods: &Api<Pod>,
    live: &[Arc<Pod>],
    bytes: &[u8],
    sandboxes: usize,
    sent: &mut HashMap<String, Vec<u8>>,
) {
    sent.retain(|uid, _| live.iter().any(|p| p.uid().as_deref() == Some(uid)));
    for p in live.iter().filter(|p| ready_to_feed(p)) {
        let uid = p.uid().unwrap_or_default();
        if sent.get(&uid).map(Vec::as_slice) == Some(bytes) {
            continue;
        }
        match write_table(proxy_pods, p, bytes).await {
            Ok(()) => {
                debug!(pod = %p.name_any(), sandboxes, "proxy table written");
                sent.insert(uid, bytes.to_vec());
            }
            Err(e) => warn!(pod = %p.name_any(), "writing the egress proxy's table: {e}"),
        }
    }
}

/// The Secrets (namespace, name) the sandboxes' credentials name, their templates' included.
fn credential_secrets(
    sandboxes: &[Arc<Sandbox>],
    templates: &[Arc<SandboxTemplate>],
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for sbx in sandboxes {
        let ns = sbx.namespace().unwrap_or_default();
        let network = effective_network(sbx, templates);
        for (_, c) in credential::refs(&network) {
            let k = (ns.clone(), c.secret_name.clone());
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
    out
}

/// Each sandbox's credentials that [`credential::decide`] refuses: the causes (each names the
/// Secret, key and domain, never a value) by Sandbox UID; a sandbox with none is not in it.
fn refused_credentials(
    sandboxes: &[Arc<Sandbox>],
    templates: &[Arc<SandboxTemplate>],
    secrets: &SecretLookup<'_>,
) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for sbx in sandboxes {
        let Some(uid) = sbx.uid() else { continue };
        let ns = sbx.namespace().unwrap_or_default();
        let network = effective_network(sbx, templates);
        for (domain, c) in credential::refs(&network) {
            let facts = secrets(&ns, &c.secret_name, &c.key);
            if let Err(r) = credential::decide(domain, c, facts.as_ref()) {
                out.entry(uid.clone()).or_default().push(r.to_string());
            }
        }
    }
    out
}

/// The sandbox's network in force: its template's when it names one that exists.
fn effective_network(sbx: &Sandbox, templates: &[Arc<SandboxTemplate>]) -> Network {
    let ns = sbx.namespace();
    let tpl = sbx.spec.template_ref.as_ref().and_then(|t| {
        templates
            .iter()
            .find(|x| x.name_any() == t.name && x.namespace() == ns)
    });
    match tpl {
        Some(t) => {
            agentbox_api::template::resolve(&t.spec, &sbx.spec)
                .pod
                .network
        }
        None => sbx.spec.pod.network.clone(),
    }
}

/// A proxy pod whose container runs (its exec works).
fn ready_to_feed(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.container_statuses.as_ref().is_some_and(|cs| {
                    cs.iter()
                        .all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
                })
        })
}

/// Runs `agentbox-proxy write-table --length N` in the proxy pod with the table on its
/// stdin. Never as an argument: the table holds credentials, and an exec's command is in the
/// request's URL (the API server's audit log) and in the pod's process list. The proxy's
/// image has no shell, so the exec is the plain one
/// ([`agentbox_api::exec::run_unwrapped_stdin`]: no wrapper); the command reads exactly N
/// bytes, so it needs no end of stdin; only the exit status is read.
async fn write_table(pods: &Api<Pod>, pod: &Pod, bytes: &[u8]) -> Result<(), String> {
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first().map(|c| c.name.clone()))
        .unwrap_or_else(|| "proxy".to_string());
    let argv = vec![
        "/usr/local/bin/agentbox-proxy".to_string(),
        "write-table".to_string(),
        "--length".to_string(),
        bytes.len().to_string(),
    ];
    let name = pod.name_any();
    let stdin = bytes::Bytes::copy_from_slice(bytes);
    let run = agentbox_api::exec::run_unwrapped_stdin(pods, &name, &container, argv, stdin);
    let out = tokio::time::timeout(WRITE_TIMEOUT, run)
        .await
        .map_err(|_| format!("no answer within {WRITE_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    if out.success() {
        Ok(())
    } else {
        Err(format!("write-table failed: {}", out.stderr_str().trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proxy() -> EgressProxy<'static> {
        static SELECTOR: std::sync::LazyLock<BTreeMap<String, String>> =
            std::sync::LazyLock::new(|| {
                parse_selector("app.kubernetes.io/name=agentbox-proxy").unwrap()
            });
        EgressProxy {
            url: "http://10.0.0.5:3128",
            namespace: "agentbox-system",
            selector: &SELECTOR,
            port: 3128,
        }
    }

    fn sandbox(name: &str, uid: &str, network: serde_json::Value) -> Arc<Sandbox> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "spec": {"image": "i", "scope": {"kind": "Global"}, "network": network}
            }))
            .unwrap(),
        )
    }

    fn pod(owner_uid: &str, ip: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("p-{ip}"), "namespace": "ns", "ownerReferences": [
                    {"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox", "name": "x",
                     "uid": owner_uid, "controller": true}]},
                "status": {"phase": phase, "podIP": ip}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_table_has_the_pods_of_sandboxes_with_domain_entries_by_their_owner() {
        let domains = json!({"egress": "Allowlist", "allow": [
            {"domain": "pypi.org", "ports": [{"port": 443}]},
            {"cidr": "10.1.0.0/16", "ports": [{"port": 80, "endPort": 90}, {"port": 53, "protocol": "UDP"}]}]});
        let sbxs = vec![
            sandbox("a", "uid-a", domains),
            sandbox(
                "b",
                "uid-b",
                json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8"}]}),
            ),
            sandbox("c", "uid-c", json!({"egress": "None"})),
        ];
        let pods = vec![
            pod("uid-a", "10.244.0.7", "Running"),
            pod("uid-a", "10.244.0.8", "Failed"),
            pod("uid-b", "10.244.0.9", "Running"),
            pod("uid-c", "10.244.0.10", "Running"),
            pod("uid-unknown", "10.244.0.11", "Running"),
        ];
        let t = build_table(&sbxs, &pods, &[], Egress::Denied, &|_, _, _| None);
        assert_eq!(t.sandboxes.len(), 1, "{t:?}");
        let e = &t.sandboxes[0];
        assert_eq!(
            (e.ip.to_string().as_str(), e.name.as_str()),
            ("10.244.0.7", "a")
        );
        assert_eq!(e.allow[0].domain.as_deref(), Some("pypi.org"));
        assert_eq!(e.allow[0].ports, vec![(443, 443)]);
        assert_eq!(e.allow[1].cidr.as_deref(), Some("10.1.0.0/16"));
        assert_eq!(
            e.allow[1].ports,
            vec![(80, 90)],
            "the UDP port is not the proxy's"
        );
    }

    #[test]
    fn a_credential_is_in_the_table_only_when_its_secret_allows_the_domain() {
        let net = json!({"egress": "Allowlist", "allow": [
            {"domain": "api.example.com", "ports": [{"port": 443}],
             "credential": {"secretName": "model-key", "key": "token"}},
            {"domain": "pypi.org"}]});
        let sbxs = vec![sandbox("a", "uid-a", net)];
        let pods = vec![pod("uid-a", "10.244.0.7", "Running")];
        let allowed = |ns: &str, name: &str, key: &str| {
            assert_eq!((ns, name, key), ("ns", "model-key", "token"));
            Some(SecretFacts {
                domains: Some("api.example.com".into()),
                value: Some(b"Bearer sk-1".to_vec()),
            })
        };
        let t = build_table(&sbxs, &pods, &[], Egress::Denied, &allowed);
        let allow = &t.sandboxes[0].allow;
        assert_eq!(allow.len(), 2);
        let c = allow[0].credential.as_ref().expect("the credential");
        assert_eq!(c.header, "Authorization");
        assert!(
            !format!("{t:?}").contains("sk-1"),
            "the table Debug-prints no value"
        );
        let elsewhere = |_: &str, _: &str, _: &str| {
            Some(SecretFacts {
                domains: Some("other.example.com".into()),
                value: Some(b"Bearer sk-1".to_vec()),
            })
        };
        for lookup in [&elsewhere as &SecretLookup<'_>, &|_, _, _| None] {
            let t = build_table(&sbxs, &pods, &[], Egress::Denied, lookup);
            let allow = &t.sandboxes[0].allow;
            assert_eq!(
                allow.len(),
                1,
                "the refused entry allows nothing: {allow:?}"
            );
            assert_eq!(allow[0].domain.as_deref(), Some("pypi.org"));
        }
    }

    #[test]
    fn refusals_are_by_sandbox_and_name_secret_key_and_domain() {
        let net = |key: &str| {
            json!({"egress": "Allowlist", "allow": [
                {"domain": "api.example.com", "credential": {"secretName": "model-key", "key": key}},
                {"domain": "pypi.org"}]})
        };
        let sbxs = vec![
            sandbox("a", "uid-a", net("token")),
            sandbox("b", "uid-b", net("gone")),
            sandbox("c", "uid-c", json!({"egress": "None"})),
        ];
        let secret = |_: &str, _: &str, key: &str| {
            Some(SecretFacts {
                domains: Some("api.example.com".into()),
                value: (key == "token").then(|| b"Bearer sk-1".to_vec()),
            })
        };
        let r = refused_credentials(&sbxs, &[], &secret);
        assert_eq!(r.len(), 1, "{r:?}");
        let causes = &r["uid-b"];
        assert_eq!(causes.len(), 1);
        for part in ["model-key", "gone", "api.example.com"] {
            assert!(causes[0].contains(part), "{part}: {causes:?}");
        }
        assert!(!causes[0].contains("sk-1"));
    }

    #[test]
    fn the_environment_points_at_the_proxy_unless_egress_is_all_or_the_spec_sets_it() {
        let allow: Network = serde_json::from_value(
            json!({"egress": "Allowlist", "allow": [{"domain": "a.example"}]}),
        )
        .unwrap();
        let env = proxy_env(&proxy(), &allow, Egress::Denied, &[]);
        let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "http_proxy",
                "https_proxy",
                "NO_PROXY",
                "no_proxy"
            ]
        );
        assert_eq!(env[0].value.as_deref(), Some("http://10.0.0.5:3128"));
        let own = vec![EnvVar {
            name: "HTTPS_PROXY".into(),
            value: Some("x".into()),
            value_from: None,
        }];
        assert_eq!(proxy_env(&proxy(), &allow, Egress::Denied, &own).len(), 5);
        let none = Network::default();
        assert_eq!(
            proxy_env(&proxy(), &none, Egress::Denied, &[]).len(),
            6,
            "None: an edit to an allowlist needs no restart"
        );
        assert!(proxy_env(&proxy(), &none, Egress::All, &[]).is_empty());
    }

    #[test]
    fn the_proxy_rule_admits_the_proxys_pods_on_its_port() {
        let r = serde_json::to_value(proxy_rule(&proxy())).unwrap();
        assert_eq!(
            r,
            json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agentbox-system"}},
                           "podSelector": {"matchLabels": {"app.kubernetes.io/name": "agentbox-proxy"}}}],
                   "ports": [{"port": 3128, "protocol": "TCP"}]})
        );
    }

    #[test]
    fn selectors_are_key_value_pairs() {
        assert_eq!(parse_selector("a=b, c=d").unwrap().len(), 2);
        assert!(parse_selector("").is_err());
        assert!(parse_selector("a").is_err());
    }
}
